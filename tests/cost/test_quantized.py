"""FP8 in the cost model (exact on hand-made profiles): E4M3 linear weights read half the
bytes at the FP8 GEMM's fit while the LM head keeps the model's dtype, an FP8 KV cache
reads and holds half the bytes a token, and the errors of what the model does not know."""
import math

import pytest

from parashift.cost.profile import Roofline
from parashift.cost.shape import load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan
from tests.cost.test_step import SHAPE, compute

FP8 = dict(fp8_gemm=Roofline(0.5, 1.0, 0.0), fp8_matmul_flops=2e12)


def test_fp8_weights_read_half_the_bytes_at_the_fp8_fit_and_the_lm_head_stays():
    fp8 = SHAPE.quantized("fp8")
    parts = StepModel(fp8, compute(**FP8)).step(Plan(), StepBatch.decode(1, 9)).parts
    # per layer: qkv (128 x 64), o (64 x 64), gate_up (256 x 64), down (64 x 128); one row
    weights = 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128
    acts = 2 * (128 + 64 + 64 + 64 + 256 + 64 + 64 + 128)
    assert math.isclose(parts["gemm"], 2 * (weights + acts) / (1e9 * 0.5), rel_tol=1e-12)
    assert math.isclose(parts["lm_head"], 2 * (256 * 64 + 256 + 64) / 1e9, rel_tol=1e-12)


def test_fp8_kv_halves_the_bytes_read_and_doubles_the_tokens_held():
    bf16, fp8 = StepModel(SHAPE, compute()), StepModel(SHAPE.quantized(None, "fp8"), compute())
    one, half = (m.step(Plan(), StepBatch.decode(1, 9)).parts["attention"] for m in (bf16, fp8))
    q = 4 * 16 * 2 * 2
    assert math.isclose(half - q / 1e9 * 2, (one - q / 1e9 * 2) / 2, rel_tol=1e-12)
    assert SHAPE.quantized(None, "fp8").kv_bytes_per_token * 2 == SHAPE.kv_bytes_per_token
    free = 1e9 * 0.5 - 1e6 - bf16.weight_bytes_per_rank(Plan())
    assert fp8.kv_tokens(Plan()) == int(free // (SHAPE.kv_bytes_per_token / 2))


def test_fp8_weights_halve_the_linear_weights_held_not_the_embeddings():
    shape = load_shape("llama-3.1-70b")
    fp8 = shape.quantized("fp8")
    assert fp8.weight_bytes == (shape.weight_bytes + shape.embedding_params * 2) // 2
    assert fp8.layer_bytes * 2 == shape.layer_bytes


def test_what_the_cost_model_does_not_know_is_an_error():
    with pytest.raises(ValueError, match="knows fp8 or none"):
        SHAPE.quantized("int4")
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp16'"):
        SHAPE.quantized(None, "fp16")
    with pytest.raises(ValueError, match="MoE experts refuse FP8"):
        load_shape("qwen3-30b-a3b").quantized("fp8")
    with pytest.raises(ValueError, match="no FP8 GEMM fit"):
        StepModel(SHAPE.quantized("fp8"), compute()).step(Plan(), StepBatch.decode(1, 9))
