"""The n-gram (prompt lookup) and suffix proposers."""
import pytest
from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.ngram import NgramProposer
from parashift.spec_decode.suffix import SuffixProposer, SuffixTrie, best_path


def test_ngram_drafts_what_followed_the_latest_earlier_match():
    proposer = NgramProposer(SpeculativeConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]
    # "2 3" last occurred before at 5-6 (followed by 5 6 7), not at 1-2
    assert proposer.propose("a", tokens, 3) == [5, 6, 7]
    assert proposer.propose("a", tokens + [5], 2) == [6, 7]  # "2 3 5" (the index grew)
    assert proposer.propose("a", tokens + [5, 6, 7, 8], 4) == []  # 8 never seen
    proposer.finish("a", [])
    assert proposer.propose("b", [4, 4], 5) == [4]  # what follows is all there is


def test_ngram_needs_prompt_lookup_min_tokens_matched():
    proposer = NgramProposer(SpeculativeConfig(prompt_lookup_min=2, prompt_lookup_max=2))
    assert proposer.propose("a", [1, 2, 3, 9, 3], 2) == []  # only a 1-gram matches
    assert proposer.propose("b", [1, 2, 3, 9, 2, 3], 2) == [9, 2]


def test_suffix_trie_counts_every_substring_up_to_its_depth():
    trie = SuffixTrie(depth=3)
    trie.extend([], [1, 2, 1, 2, 3])
    assert trie.root.children[1].count == 2 and trie.root.children[2].count == 2
    assert trie.root.children[1].children[2].count == 2
    assert trie.root.children[1].children[2].children[1].count == 1
    assert 3 not in trie.root.children[1].children[2].children[1].children  # depth 3
    node, length = trie.match([7, 1, 2])
    assert length == 2 and set(node.children) == {1, 3}
    trie.remove([1, 2, 1, 2, 3])
    assert trie.root.children == {}


def test_best_path_stops_below_the_probability_threshold():
    trie = SuffixTrie(depth=8)
    for tail in ([5, 6, 7], [5, 6, 7], [5, 6, 8], [5, 9]):
        trie.extend([], [1] + tail)
    node = trie.root.children[1]
    assert best_path(node, 8, 0.5) == ([5, 6, 7], 1 + 0.75 + 0.5)
    assert best_path(node, 8, 0.6)[0] == [5, 6]  # 7 would take the path to 0.5
    assert best_path(node, 1, 0.0)[0] == [5]


def test_suffix_drafts_from_its_own_request_and_from_finished_outputs():
    config = SpeculativeConfig(method="suffix", suffix_decoding_max_cached_requests=1,
                               suffix_decoding_min_token_prob=0.3)
    proposer = SuffixProposer(config)
    assert proposer.propose("a", [1, 2, 3, 4, 1, 2], 4) == [3, 4]  # factor 1: 2 matched
    proposer.finish("a", [10, 11, 12, 13, 14])
    assert proposer.propose("b", [7, 10, 11, 12], 3) == [13, 14]  # the global cache
    proposer.finish("b", [20, 21, 22])  # the cache holds one: "a"'s output leaves
    assert proposer.propose("c", [7, 10, 11, 12], 3) == []
    assert proposer.propose("c", [7, 20, 21], 3) == [22]


def test_suffix_draft_length_follows_the_match_length():
    config = SpeculativeConfig(method="suffix", suffix_decoding_max_spec_factor=0.5)
    proposer = SuffixProposer(config)
    tokens = list(range(20)) + [30] + list(range(8))
    assert proposer.propose("a", tokens, 10) == [8, 9, 10, 11]  # 8 matched -> 4 drafted


def test_the_draft_model_takes_half_the_memory_the_target_leaves():
    from parashift.spec_decode.draft_model import draft_memory_share
    assert draft_memory_share(0.9) == pytest.approx(0.95)
    assert draft_memory_share(0.5) == pytest.approx(0.75)
    assert draft_memory_share(1.0) == 1.0


@pytest.mark.parametrize("switch, target_graphs, draft_graphs", [
    (True, None, None), (True, True, None), (True, False, False), (False, None, False)])
def test_the_draft_model_replays_graphs_unless_the_target_is_eager(
        monkeypatch, switch, target_graphs, draft_graphs):
    """With DRAFT_GRAPHS, None: where they work (CUDA; eager on this CPU); --enforce-eager
    holds for both. Without it (today's default) the draft is eager."""
    from parashift.config import EngineConfig
    from parashift.spec_decode import draft_model
    from parashift.spec_decode.draft_model import draft_engine_config
    monkeypatch.setattr(draft_model, "DRAFT_GRAPHS", switch)
    target = EngineConfig(device="cpu", cuda_graphs=target_graphs, deterministic=True,
                          max_num_seqs=7, gpu_memory_utilization=0.8)
    draft = draft_engine_config(target, "draft-dir")
    assert (draft.model, draft.cuda_graphs, draft.max_num_seqs) == ("draft-dir", draft_graphs, 7)
    assert draft.deterministic and draft.skip_tokenizer_init
    assert draft.gpu_memory_utilization == pytest.approx(0.9)
