"""Penalties and logit bias in the engine (against Hugging Face's generate, and the same
under async and one-step-at-a-time scheduling); n and best_of as child requests sharing
the prompt's cached KV blocks."""
import pytest
import torch

from parashift import SamplingParams
from tests.engine.conftest import tiny_llm
from tests.helpers.faults import FAILING_SEED, fail_generator_for_seed

PROMPT = [5, 17, 200, 17, 5, 33, 90, 5, 17, 300, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
          60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return tiny_llm(tiny_llama_dir)


@pytest.fixture(scope="module")
def sync_llm(tiny_llama_dir):
    return tiny_llm(tiny_llama_dir, async_scheduling=False)


def tokens(llm, params, prompt=PROMPT) -> list[int]:
    return llm.generate(prompt, params)[0].outputs[0].token_ids


def test_repetition_penalty_matches_hugging_face(llm, tiny_llama_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)
    for penalty in (1.8, 0.6):  # the prompt is in the prefix cache after the first
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False,
                              repetition_penalty=penalty, pad_token_id=0,
                              eos_token_id=None)[0, len(PROMPT):].tolist()
        got = tokens(llm, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                         repetition_penalty=penalty))
        assert got == want, penalty


@pytest.mark.parametrize("options", [dict(repetition_penalty=1.5),
                                     dict(frequency_penalty=1.0, presence_penalty=0.5),
                                     dict(presence_penalty=-2.0, logit_bias={7: 3.0}),
                                     dict(frequency_penalty=0.7, temperature=0.9, seed=4)])
def test_penalties_same_under_async_scheduling(llm, sync_llm, options):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 20, "ignore_eos": True,
                               **options})
    plain = SamplingParams(**{**params.__dict__, "repetition_penalty": 1.0,
                              "frequency_penalty": 0.0, "presence_penalty": 0.0,
                              "logit_bias": None})
    prompts = [PROMPT, PROMPT[:7], [3] * 30]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == [o.outputs[0].token_ids for o in sync_llm.generate(prompts, params)]
    assert got != [o.outputs[0].token_ids for o in llm.generate(prompts, plain)]


def test_frequency_penalty_stops_a_repeated_token(llm):
    """A token that greedy decoding repeats gets a frequency penalty past its lead."""
    plain = tokens(llm, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    penalized = tokens(llm, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                           frequency_penalty=2.0, presence_penalty=2.0))
    assert max(map(penalized.count, penalized)) < max(map(plain.count, plain))


def test_logit_bias_out_of_vocabulary_is_refused(llm):
    with pytest.raises(ValueError, match="logit_bias names token id 512"):
        llm.generate(PROMPT, SamplingParams(logit_bias={3: 1.0, 512: 1.0}))
    assert not llm.llm_engine.has_unfinished_requests()


def test_n_samples_are_distinct_and_reproducible(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=123, max_tokens=8, ignore_eos=True)
    out = llm.generate(PROMPT, params)
    assert len(out) == 1 and out[0].finished
    samples = [c.token_ids for c in out[0].outputs]
    assert [c.index for c in out[0].outputs] == [0, 1, 2, 3]
    assert len({tuple(s) for s in samples}) == 4
    again = llm.generate([PROMPT, PROMPT[:5]], [params, params])[0]
    assert [c.token_ids for c in again.outputs] == samples
    # the k-th sample is the one a single request with seed + k gives
    third = SamplingParams(temperature=1.0, seed=125, max_tokens=8, ignore_eos=True)
    assert tokens(llm, third) == samples[2]


def test_siblings_take_the_prompt_from_the_prefix_cache(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir)
    engine = llm.llm_engine
    prompt = [9, 8, 7] + PROMPT  # 43 tokens: two full blocks of 16 can be shared
    engine.add_request("r", prompt, SamplingParams(n=3, temperature=1.0, seed=0,
                                                    max_tokens=4, ignore_eos=True))
    assert [s.request_id for s in engine.scheduler.waiting] == ["r#0"]  # the first alone
    tables, outputs = {}, []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        tables.update({s.request_id: list(s.block_table) for s in engine.scheduler.running})
        cached = {s.request_id: s.num_cached_tokens for s in engine.scheduler.running}
        if len(cached) == 3:
            assert cached == {"r#0": 0, "r#1": 32, "r#2": 32}
    assert tables["r#1"][:2] == tables["r#2"][:2] == tables["r#0"][:2]
    final = outputs[-1]
    assert final.request_id == "r" and final.finished and len(final.outputs) == 3
    assert final.num_cached_tokens == 64


def test_without_prefix_caching_siblings_start_together(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, enable_prefix_caching=False)
    llm.llm_engine.add_request("r", PROMPT, SamplingParams(n=2, max_tokens=2))
    assert len(llm.llm_engine.scheduler.waiting) == 2
    out = llm._run(["r"], use_tqdm=False)[0]
    assert len(out.outputs) == 2 and out.num_cached_tokens == 0


def test_best_of_keeps_the_n_most_likely(llm):
    common = dict(temperature=1.0, seed=9, max_tokens=6, ignore_eos=True)
    every = llm.generate(PROMPT, SamplingParams(n=5, logprobs=0, **common))[0].outputs
    best = llm.generate(PROMPT, SamplingParams(n=2, best_of=5, **common))[0].outputs
    ranked = sorted(every, key=lambda c: c.cumulative_logprob, reverse=True)
    assert [c.token_ids for c in best] == [c.token_ids for c in ranked[:2]]
    assert [c.index for c in best] == [0, 1] and all(c.logprobs is None for c in best)
    assert best[0].cumulative_logprob == pytest.approx(ranked[0].cumulative_logprob)


def test_abort_ends_every_child(llm):
    engine = llm.llm_engine
    engine.add_request("gone", PROMPT, SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort_request("gone")
    while engine.has_unfinished_requests():
        assert all(o.request_id != "gone" for o in engine.step())
    assert engine.stats().num_running == 0


def test_a_parent_whose_child_id_is_taken_is_refused_whole(llm):
    engine = llm.llm_engine
    engine.add_request("p#1", PROMPT, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="'p#1' is already in use"):
        engine.add_request("p", PROMPT, SamplingParams(n=2, max_tokens=1))
    engine.abort_request("p#1")
    assert not engine.has_unfinished_requests()
    assert llm.generate(PROMPT, SamplingParams(n=2, max_tokens=1))[0].finished


def test_a_failing_sample_fails_the_request_and_ends_its_siblings(llm, monkeypatch):
    """Sample 1's seed (FAILING_SEED) cannot be used: the request fails with its error,
    sample 0 is ended, and the request beside it finishes normally."""
    fail_generator_for_seed(monkeypatch)
    bad = SamplingParams(n=2, temperature=0.7, seed=FAILING_SEED - 1, max_tokens=30,
                         ignore_eos=True)
    good = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outs = llm.generate([PROMPT, [1, 2, 3]], [bad, good])
    assert outs[0].finished and "boom" in outs[0].error
    assert "error" in [c.finish_reason for c in outs[0].outputs]
    assert len(outs[1].outputs[0].token_ids) == 4 and outs[1].error is None
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and not engine._parents and not engine._parent_of
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
