"""SmolLM2-135M (9 query / 3 KV heads) split over three ranks gives the
single-device tokens."""
import pytest

from parashift import LLM, SamplingParams

QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
             "Write a haiku about the sea."]
PARAMS = SamplingParams(temperature=0, max_tokens=24, logprobs=2)


@pytest.fixture(scope="module")
def reference():
    llm = LLM(device="cpu", dtype="float32", max_num_batched_tokens=32)
    return llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], PARAMS)


@pytest.mark.parametrize("plan", [dict(tensor_parallel_size=3), dict(sequence_parallel_size=3)])
def test_three_ranks_match_single_device(reference, plan):
    llm = LLM(device="cpu", dtype="float32", max_num_batched_tokens=32, **plan)
    try:
        outputs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], PARAMS)
    finally:
        llm.llm_engine.shutdown()
    assert outputs[0].outputs[0].text == "The capital of France is Paris."
    for out, ref in zip(outputs, reference):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        for got, want in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert max(abs(got[t] - want[t]) for t in got.keys() & want.keys()) < 1e-4
