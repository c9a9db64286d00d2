"""Speculative decoding under async scheduling (one device): a sequence that drafts waits
for its token on its way (it is left out of the step scheduled ahead), the others' plain
decodes keep their placeholders. Greedy output is the output of one step at a time
without speculation (bit-identical logprobs in deterministic mode), every verification
starts from the sequence's real tokens, and seeded sampling, n > 1, stop tokens, stop
strings and structured output compose."""
import pytest

from parashift import LLM, SamplingParams
from parashift.step.message import PLACEHOLDER_TOKEN
from tests.engine.conftest import tiny_llm, tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.engine.test_llm_engine import random_prompts
from tests.engine.test_spec_decode import (GREEDY, METHODS, PROMPTS, REPEAT, penalized, spec,
                                          token_ids)

# repeating prompts (drafts found) and random ones (drafts back off: their decodes pipeline)
MIXED = PROMPTS + random_prompts(4, seed=5, lengths=(3, 30))
OPTIONS = dict(deterministic=True, max_num_batched_tokens=64)


class StepSpy:
    """Every chunk submitted, by request: (start, tokens, samples, whether the replica had
    a step in flight); steps submitted while another ran, and their placeholders."""

    def __init__(self, llm: LLM):
        engine = llm.llm_engine
        self.chunks: dict[str, list] = {}
        self.overlapped = self.placeholders = self.verifications = 0
        submit = engine.executor.submit

        def spying_submit(replica, ranks, output_rank, batch):
            ahead = bool(replica.in_flight)
            self.overlapped += ahead
            for chunk in batch.all_chunks():
                self.chunks.setdefault(chunk.request_id, []).append(
                    (chunk.start_pos, list(chunk.token_ids), chunk.samples, ahead))
                self.placeholders += ahead and PLACEHOLDER_TOKEN in chunk.token_ids
                self.verifications += chunk.samples > 1
            submit(replica, ranks, output_rank, batch)
        engine.executor.submit = spying_submit

    def assert_verified_real_tokens(self, outputs, prompts) -> None:
        """Each verification's tokens before its draft are the sequence's own (no
        placeholder, no stale token): the final output's at those positions."""
        for out, prompt in zip(outputs, prompts):
            final = list(prompt) + list(out.outputs[0].token_ids)
            for start, tokens, samples, _ in self.chunks[out.request_id]:
                if samples > 1:
                    known = tokens[:len(tokens) - (samples - 1)]
                    assert known == final[start:start + len(known)], out.request_id


@pytest.fixture(scope="module")
def one_at_a_time(tiny_llama_dir):
    """The reference: no speculation, one step at a time."""
    llm = tiny_llm(tiny_llama_dir, async_scheduling=False, **OPTIONS)
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="module", params=METHODS)
def async_spec(request, tiny_llama_dir):
    """check_step_state: each placeholder's source row is checked on the rank (a
    verification before it in the previous step sampled 1 + k rows)."""
    llm = tiny_llm(tiny_llama_dir, async_scheduling=True, speculative_config=spec(request.param),
                   check_step_state=True, **OPTIONS)
    yield llm
    llm.llm_engine.shutdown()


def test_greedy_is_the_one_step_at_a_time_output(one_at_a_time, async_spec):
    spy = StepSpy(async_spec)
    before = async_spec.llm_engine.spec_decode_stats().num_accepted_tokens
    want, got = one_at_a_time.generate(MIXED, GREEDY), async_spec.generate(MIXED, GREEDY)
    assert token_ids(got) == token_ids(want)
    for out, ref in zip(got, want):
        assert out.outputs[0].logprobs == ref.outputs[0].logprobs  # deterministic: exact
    assert async_spec.llm_engine.spec_decode_stats().num_accepted_tokens > before
    assert spy.verifications > 0  # drafting sequences waited for their tokens
    assert spy.placeholders > 0  # while the others' decodes were scheduled ahead
    spy.assert_verified_real_tokens(got, MIXED)


def test_seeded_sampling_n_samples_and_stop_tokens(one_at_a_time, async_spec):
    """Seeded rows draw the tokens of one step at a time without speculation (as
    speculation one step at a time does); n > 1 and a stop token inside a draft."""
    seeded = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=24,
                             ignore_eos=True) for s in range(len(MIXED))]
    assert token_ids(async_spec.generate(MIXED, seeded)) == \
        token_ids(one_at_a_time.generate(MIXED, seeded))
    n_params = SamplingParams(n=3, temperature=0.7, seed=11, max_tokens=13, ignore_eos=True)
    assert token_ids(async_spec.generate(MIXED[:3], n_params)) == \
        token_ids(one_at_a_time.generate(MIXED[:3], n_params))
    reference = token_ids(one_at_a_time.generate(PROMPTS, GREEDY))
    stops = [SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[ids[len(ids) // 2]])
             for ids in reference]
    got = async_spec.generate(PROMPTS, stops)
    assert token_ids(got) == token_ids(one_at_a_time.generate(PROMPTS, stops))
    assert all(out.outputs[0].finish_reason == "stop" for out in got)


def test_penalties_preemption_and_chunked_prefill(one_at_a_time, tiny_llama_dir):
    """Penalties read each drafted row's history (placeholders filled from the rows
    sampled before); a pool too small for every sequence preempts, a small budget cuts
    prompts and drafts: the output of one step at a time without speculation."""
    options = dict(num_blocks=24, block_size=8, max_num_batched_tokens=24, max_num_seqs=8,
                   max_model_len=160)
    prompts = [p * 2 for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = tiny_llm(tiny_llama_dir, async_scheduling=False, **options)
    want = token_ids(plain.generate(prompts, params))
    plain.llm_engine.shutdown()
    llm = tiny_llm(tiny_llama_dir, async_scheduling=True, speculative_config=spec("ngram", 6),
                   **options)
    try:
        assert token_ids(llm.generate(prompts, params)) == want
        stats = llm.llm_engine.stats()
        assert stats.num_preemptions > 0 and stats.spec_decode_num_accepted_tokens > 0
        for params in (penalized(), penalized(range(len(MIXED)))[:len(PROMPTS)]):
            assert token_ids(llm.generate(PROMPTS, params)) == \
                token_ids(one_at_a_time.generate(PROMPTS, params))
    finally:
        llm.llm_engine.shutdown()


def test_a_draft_model_that_is_always_right(one_at_a_time, tiny_llama_dir):
    """The target as its own draft: every sequence drafts at every chance, so none is
    scheduled ahead (the engine waits for each step): the output is the plain one."""
    llm = tiny_llm(tiny_llama_dir, async_scheduling=True, **OPTIONS,
                   speculative_config={"method": "draft_model", "model": tiny_llama_dir,
                                       "num_speculative_tokens": 3})
    try:
        spy = StepSpy(llm)
        got = llm.generate(PROMPTS, GREEDY)
        assert token_ids(got) == token_ids(one_at_a_time.generate(PROMPTS, GREEDY))
        assert llm.llm_engine.spec_decode_stats().acceptance_rate == 1.0
        spy.assert_verified_real_tokens(got, PROMPTS)
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def smollm2_ngram_async():
    llm = LLM(device="cpu", dtype="float32", async_scheduling=True,
              speculative_config=spec("ngram"))
    yield llm
    llm.llm_engine.shutdown()


def test_stop_string_and_structured_output(smollm2, smollm2_ngram_async):
    """SmolLM2 repeats a code (drafts accepted): a stop string inside an accepted draft
    ends the text there, and a structured request (one step at a time: its next mask needs
    its token) keeps its grammar at each drafted position, as without speculation."""
    from parashift.structured import StructuredOutputsParams
    whole = smollm2.generate([REPEAT], SamplingParams(temperature=0, max_tokens=48))
    stop = whole[0].outputs[0].text[40:45]
    constraint = StructuredOutputsParams(regex=r"(def [a-z]+\(a, b\):\n    return a [-+*] b\n\n)+")
    requests = [SamplingParams(temperature=0, max_tokens=48, stop=[stop], logprobs=1),
                SamplingParams(temperature=0, max_tokens=40, structured_outputs=constraint)]
    for params in requests:
        stats = smollm2_ngram_async.llm_engine.spec_decode_stats()
        before = stats.num_accepted_tokens
        want = smollm2.generate([REPEAT], params)[0].outputs[0]
        got = smollm2_ngram_async.generate([REPEAT], params)[0].outputs[0]
        assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == \
            (want.text, want.token_ids, want.finish_reason, want.stop_reason)
        assert stats.num_accepted_tokens > before
        if params.stop:
            assert (got.finish_reason, got.stop_reason) == ("stop", stop)
