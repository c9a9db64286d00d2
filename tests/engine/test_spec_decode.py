"""Speculative decoding in the engine (one device, a tiny random Llama): greedy output is
the output without speculation token for token (bit-identical logprobs in deterministic
mode), seeded sampling draws the same tokens (a request's draw depends on its seed and
position only), and stops, max_tokens, n > 1, penalties (over the drafts), structured
output, prefix caching, chunked prefill and preemption compose."""
import pytest

from parashift import SamplingParams
from tests.engine.conftest import tiny_llm, tiny_llama_dir  # noqa: F401  (shared fixture)

METHODS = ["ngram", "suffix"]
# prompts that repeat themselves, so that drafts are found and often accepted
PROMPTS = [[7, 8, 9, 10, 11] * 6, [100, 200, 300] * 9 + [100], list(range(40, 80)),
           [5, 6] * 12 + [400, 401, 402]]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)


def spec(method: str, k: int = 4) -> dict:
    return {"method": method, "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, deterministic=True, max_num_batched_tokens=64)
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="module", params=METHODS)
def speculative(request, tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, deterministic=True, max_num_batched_tokens=64,
                   speculative_config=spec(request.param))
    yield llm
    llm.llm_engine.shutdown()


def token_ids(outputs) -> list[list[int]]:
    return [list(c.token_ids) for out in outputs for c in out.outputs]


def test_greedy_is_the_plain_output_with_bit_identical_logprobs(plain, speculative):
    before = speculative.llm_engine.spec_decode_stats().num_accepted_tokens
    want, got = plain.generate(PROMPTS, GREEDY), speculative.generate(PROMPTS, GREEDY)
    assert token_ids(got) == token_ids(want)
    for out, ref in zip(got, want):
        assert out.outputs[0].logprobs == ref.outputs[0].logprobs  # deterministic: exact
    stats = speculative.llm_engine.spec_decode_stats()
    assert stats.num_accepted_tokens > before  # drafts were verified and accepted
    assert 0 < stats.acceptance_rate <= 1 and stats.mean_accepted_length > 1


def test_seeded_sampling_draws_the_plain_tokens(plain, speculative):
    """Each verified position samples with the request's seed at that position: the
    tokens without speculation, so the target distribution is kept draw for draw."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=30,
                             ignore_eos=True) for s in range(len(PROMPTS))]
    assert token_ids(speculative.generate(PROMPTS, params)) == \
        token_ids(plain.generate(PROMPTS, params))


def test_n_samples_and_max_tokens_inside_a_draft(plain, speculative):
    params = SamplingParams(n=3, temperature=0.7, seed=11, max_tokens=13, ignore_eos=True)
    got = speculative.generate(PROMPTS[:2], params)
    assert token_ids(got) == token_ids(plain.generate(PROMPTS[:2], params))
    assert all(len(c.token_ids) == 13 and c.finish_reason == "length"
               for out in got for c in out.outputs)


def test_stop_token_inside_a_draft(plain, speculative):
    """The stop token id ends the output at its first occurrence, also where it comes
    in the middle of an accepted draft."""
    reference = token_ids(plain.generate(PROMPTS, GREEDY))
    stops = [ids[len(ids) // 2] for ids in reference]
    params = [SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop])
              for stop in stops]
    got = speculative.generate(PROMPTS, params)
    assert token_ids(got) == token_ids(plain.generate(PROMPTS, params))
    for out, ids, stop in zip(got, reference, stops):
        assert out.outputs[0].token_ids == ids[:ids.index(stop) + 1]
        assert out.outputs[0].finish_reason == "stop"


PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1)


def penalized(seeds=None, max_tokens=24) -> list[SamplingParams]:
    """Greedy (no seeds) or seeded sampling with every penalty, for each prompt."""
    if seeds is None:
        return [SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                               **PENALTIES)] * len(PROMPTS)
    return [SamplingParams(temperature=0.8, seed=s, max_tokens=max_tokens, ignore_eos=True,
                           **PENALTIES) for s in seeds]


def test_penalties_over_drafts_and_prefix_caching(plain, speculative):
    """A drafted position's penalties count the draft's tokens before it (its row is
    sampled as if they were accepted): greedy and seeded output is the plain one, drafts
    accepted; a prompt served again from the prefix cache gives the same."""
    greedy, seeded = penalized(), penalized(range(len(PROMPTS)))
    want = [token_ids(plain.generate(PROMPTS, p)) for p in (greedy, seeded)]
    before = speculative.llm_engine.spec_decode_stats().num_accepted_tokens
    for _ in range(2):  # the second from the prefix cache (only verified blocks cached)
        assert [token_ids(speculative.generate(PROMPTS, p)) for p in (greedy, seeded)] == want
    assert speculative.llm_engine.spec_decode_stats().num_accepted_tokens > before


@pytest.mark.parametrize("method", METHODS)
def test_preemption_and_chunked_prefill(tiny_llama_dir, method):
    """A pool too small for every sequence preempts (drafts dropped, computed again) and
    a small budget cuts prompts and drafts; the output stays the plain one."""
    options = dict(num_blocks=24, block_size=8, max_num_batched_tokens=24, max_num_seqs=8,
                   max_model_len=160)
    prompts = [p * 2 for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = tiny_llm(tiny_llama_dir, **options)
    want = token_ids(plain.generate(prompts, params))
    plain.llm_engine.shutdown()
    llm = tiny_llm(tiny_llama_dir, speculative_config=spec(method, 6), **options)
    try:
        assert token_ids(llm.generate(prompts, params)) == want
        assert llm.llm_engine.stats().num_preemptions > 0
        assert llm.llm_engine.stats().spec_decode_num_accepted_tokens > 0
    finally:
        llm.llm_engine.shutdown()


def test_draft_model_greedy_is_the_plain_output(plain, tiny_llama_dir, tmp_path):
    """The target itself as its draft (every draft accepted) and another tiny model of the
    same vocabulary (few accepted): the plain output either way, also with penalties (the
    draft drafts without them: the target's penalized samples decide)."""
    from tests.engine.conftest import save_tiny_llama
    other = save_tiny_llama(tmp_path / "other", num_hidden_layers=1, hidden_size=32,
                            intermediate_size=64)
    want = token_ids(plain.generate(PROMPTS, GREEDY))
    want_penalized = token_ids(plain.generate(PROMPTS, penalized()))
    for draft, all_accepted in ((tiny_llama_dir, True), (other, False)):
        llm = tiny_llm(tiny_llama_dir, deterministic=True, max_num_batched_tokens=64,
                       speculative_config={"method": "draft_model", "model": draft,
                                           "num_speculative_tokens": 3})
        try:
            assert token_ids(llm.generate(PROMPTS, GREEDY)) == want
            stats = llm.llm_engine.spec_decode_stats()
            assert stats.num_drafts > 0
            assert (stats.acceptance_rate == 1.0) == all_accepted
            accepted = stats.num_accepted_tokens
            assert token_ids(llm.generate(PROMPTS, penalized())) == want_penalized
            if all_accepted:  # the penalized target still takes many of its own drafts
                assert llm.llm_engine.spec_decode_stats().num_accepted_tokens > accepted
        finally:
            llm.llm_engine.shutdown()


def test_a_draft_model_of_another_tokenizer_is_an_error(tiny_llama_dir, tmp_path):
    from tests.engine.conftest import save_tiny_llama
    other = save_tiny_llama(tmp_path / "other_vocab", vocab_size=256)
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        tiny_llm(tiny_llama_dir, speculative_config={"method": "draft_model", "model": other})


CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" \
       "def mul(a, b):\n    return a * b\n"
REPEAT = f"Repeat this code exactly:\n{CODE}\nRepeated:\n"


@pytest.fixture(scope="module")
def smollm2_ngram():
    from parashift import LLM
    llm = LLM(device="cpu", dtype="float32", speculative_config=spec("ngram"))
    yield llm
    llm.llm_engine.shutdown()


def test_stop_string_inside_an_accepted_draft(smollm2, smollm2_ngram):
    """SmolLM2 repeats a code (its drafts are accepted): a stop string that ends inside a
    verification's accepted tokens ends the text there, as without speculation."""
    whole = smollm2.generate([REPEAT], SamplingParams(temperature=0, max_tokens=48))
    stop = whole[0].outputs[0].text[40:45]  # in the middle of the repeated code
    params = SamplingParams(temperature=0, max_tokens=48, stop=[stop], logprobs=1)
    want = smollm2.generate([REPEAT], params)[0].outputs[0]
    before = smollm2_ngram.llm_engine.spec_decode_stats().num_accepted_tokens
    got = smollm2_ngram.generate([REPEAT], params)[0].outputs[0]
    assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == \
        (want.text, want.token_ids, "stop", stop)
    assert len(got.logprobs) == len(got.token_ids)
    assert smollm2_ngram.llm_engine.spec_decode_stats().num_accepted_tokens > before


def test_structured_output_masks_each_drafted_position(smollm2, smollm2_ngram):
    """A draft is cut at the first token the grammar refuses, and each verified position
    samples under the grammar's mask after the draft before it: the plain output."""
    from parashift.structured import StructuredOutputsParams
    constraint = StructuredOutputsParams(regex=r"(def [a-z]+\(a, b\):\n    return a [-+*] b\n\n)+")
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=constraint)
    want = smollm2.generate([REPEAT], params)[0].outputs[0]
    before = smollm2_ngram.llm_engine.spec_decode_stats().num_accepted_tokens
    got = smollm2_ngram.generate([REPEAT], params)[0].outputs[0]
    assert (got.text, got.token_ids) == (want.text, want.token_ids)
    assert smollm2_ngram.llm_engine.spec_decode_stats().num_accepted_tokens > before
