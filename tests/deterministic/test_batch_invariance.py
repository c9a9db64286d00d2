"""Deterministic mode on one device: a request's tokens and logprobs are bit-identical
alone, in a batch of 8 mixed-length requests and in a batch of 64, under prefill chunks
cut differently by the token budget; greedy and seeded sampling alike."""
import os
import random

import pytest

from parashift import SamplingParams
from tests.engine.conftest import tiny_llm

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")  # "cuda": the GPU kernels, graphs

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True,
                        logprobs=3)


def requests(n: int, seed: int = 0, vocab: int = 512):
    """n prompts of 1 to 90 tokens; every third request samples with a seed."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 90))] for _ in range(n)]
    return prompts, [SEEDED if i % 3 == 2 else GREEDY for i in range(n)]


def assert_identical(outputs, reference) -> None:
    assert len(outputs) == len(reference)
    for out, ref in zip(outputs, reference):
        got, want = out.outputs[0], ref.outputs[0]
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs  # floats compared exactly


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_alone_in_8_and_in_64(tiny_llama_dir, dtype):
    assert_batch_invariant(tiny_llm(tiny_llama_dir, device=DEVICE, dtype=dtype,
                                    deterministic=True, max_num_batched_tokens=64,
                                    enable_prefix_caching=False))


def assert_batch_invariant(llm) -> None:
    """requests(64)'s first 8 alone, together and among all 64 give the same outputs; shuts
    `llm` down."""
    prompts, params = requests(64)
    try:
        alone = [llm.generate([p], [s])[0] for p, s in zip(prompts[:8], params[:8])]
        in_8 = llm.generate(prompts[:8], params[:8])
        in_64 = llm.generate(prompts, params)[:8]
    finally:
        llm.llm_engine.shutdown()
    assert_identical(in_8, alone)
    assert_identical(in_64, alone)
