"""Deterministic mode with FP8 weights and an FP8 KV cache, bf16 activations: bit-identical
tokens and logprobs whatever the batch, and on TP=2 and under Shift's random switches as
on one device (the weights' scales are whole-row, so every shard dequantizes the same)."""
import random

import pytest

from parashift.engine.policy import ScriptedPolicy
from tests.deterministic.test_batch_invariance import DEVICE, assert_batch_invariant, \
    assert_identical
from tests.deterministic.test_plan_invariance import model_dirs, run  # noqa: F401 (fixture)
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)

FP8 = dict(quantization="fp8", kv_cache_dtype="fp8")


def test_fp8_alone_in_8_and_in_64(tiny_llama_dir):
    assert_batch_invariant(tiny_llm(tiny_llama_dir, device=DEVICE, dtype="bfloat16",
                                    deterministic=True, max_num_batched_tokens=64,
                                    enable_prefix_caching=False, **FP8))


@pytest.fixture(scope="module")
def reference(model_dirs):
    return run(model_dirs["gqa8x4"], "bfloat16", **FP8)


def test_fp8_tp2_gives_single_device_logprobs(model_dirs, reference):
    assert_identical(run(model_dirs["gqa8x4"], "bfloat16", tensor_parallel_size=2, **FP8),
                     reference)


def test_fp8_shift_switches_give_single_device_logprobs(model_dirs, reference):
    rng = random.Random(0)

    def random_switches(plans):
        return ScriptedPolicy(plans, lambda group: rng.choice(plans))
    outputs = run(model_dirs["gqa8x4"], "bfloat16", random_switches, sequence_parallel_size=2,
                  parallel_policy="shift", **FP8)
    assert_identical(outputs, reference)
