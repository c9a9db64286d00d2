"""The small-batch experts (kernels/moe_small.py: a GEMV per pair's expert, SiLU-and-mul and
the weighted top-k sum fused) against the PyTorch path, layers.fused_moe.expert_outputs, and
the grouped GEMM they stand in for: 1, 2, 8 and 16 tokens (CUDA) at top-8 of 128 experts, odd
sizes (K not a multiple of the tile, k not a power of two), experts held elsewhere (EP), a
narrowed layout's strided views, repeated experts, bf16/fp16/fp32 and FP8 experts; under the
Triton interpreter on the CPU and compiled on CUDA."""
import itertools

import pytest
import torch

from parashift.kernels import fused_moe, moe_small
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.fused_moe import expert_outputs
from tests.kernels.common import assert_graph_replays, case_tests, cuda, cuda_tests
from tests.kernels.test_fused_moe import TOLERANCE, inputs

# tiles: an index into TILES, forced tiles run beside the chosen ones
CASES = [
    dict(tokens=1, experts=128, top_k=8, hidden=64, inter=48, tiles=0),
    dict(tokens=2, experts=128, top_k=8, hidden=72, inter=40, tiles=1),  # K not a tile multiple
    dict(tokens=8, experts=128, top_k=8, hidden=64, inter=32, crowd=True, tiles=2),  # shared
    dict(tokens=16, experts=128, top_k=8, hidden=48, inter=24, tiles=1),  # wide: fewer programs
    dict(tokens=3, experts=16, top_k=6, hidden=40, inter=24, tiles=1),  # k not a power of 2
    dict(tokens=4, experts=8, top_k=2, hidden=64, inter=32, held=3, first=4, tiles=2),  # EP
    dict(tokens=2, experts=8, top_k=8, hidden=64, inter=32, held=4, first=2, crowd=True,
         tiles=0),
    dict(tokens=5, experts=4, top_k=2, hidden=64, inter=64, narrow=True, tiles=1),
]
# forced tiles, (BLOCK_N, BLOCK_K, warps) of gate_up and of down: narrow column tiles past
# the end of the rows, a K step wider than K, the smallest K step
TILES = [((8, 16, 1), (8, 16, 1)), ((64, 128, 4), (32, 128, 4)), ((16, 32, 2), (16, 64, 2))]


# against expert_outputs, which sums a token's k pairs in the activations' dtype (a rounding
# per add: at top-8 in bf16 up to ~1.5x TOLERANCE off the fp32 sum the kernels round once)
SUM_TOLERANCE = {**TOLERANCE, "bfloat16": 5e-2}


def rounded_reference(x, weights, ids, gate_up, down, first=0):
    """The experts rounded as the kernels round them (gate and up, SiLU-and-mul, each pair's
    down output and its weighted value in x's dtype), the k pairs summed in fp32."""
    dtype, out = x.dtype, torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for token, pair in itertools.product(range(ids.shape[0]), range(ids.shape[1])):
        expert = int(ids[token, pair]) - first
        if 0 <= expert < gate_up.shape[0]:
            gate_up_out = (x[token].float() @ gate_up[expert].flatten(0, -2).float().T).to(dtype)
            y = (silu_and_mul_torch(gate_up_out).float() @ down[expert].float().T).to(dtype)
            out[token] += (y.float() * weights[token, pair].float()).to(dtype).float()
    return out.to(dtype)


def check(dtype="float32", device="cpu", tiles=0, **case):
    args = inputs(**case, dtype=dtype, device=device)
    tol, sum_tol = TOLERANCE[dtype], SUM_TOLERANCE[dtype]
    rounded = rounded_reference(*args)
    out = moe_small.small_experts(*args)
    torch.testing.assert_close(out, rounded, atol=tol, rtol=tol)
    torch.testing.assert_close(out, expert_outputs(*args), atol=sum_tol, rtol=sum_tol)
    forced = moe_small.small_experts(*args, tiles=TILES[tiles])
    torch.testing.assert_close(forced, rounded, atol=tol, rtol=tol)
    # the grouped GEMM rounds alike: only the fp32 sums' order differs
    torch.testing.assert_close(out, fused_moe.grouped_experts(*args), atol=tol, rtol=tol)


# the 16-token case on CUDA only: its 128 pairs cost the interpreter twice the 8-token case,
# where choose_tiles picks the same 8-column tiles (132 SMs) from 4 tokens to 16, and its odd
# K and forced tiles are the 2- and 3-token cases'
INTERPRETED_CASES = [case for case in CASES if case["tokens"] != 16]
test_interpreted, _ = case_tests(__name__, check, INTERPRETED_CASES, uses_dot=True,
                                 variants_in_one_dtype=True)
test_cuda = cuda_tests(check, CASES)


def check_fp8(dtype="float32", device="cpu", tiles=0, **case):
    """E4M3 experts read as stored against the dequantized experts in fp32 (as the grouped
    path's FP8 test) and against the grouped path's FP8 kernel."""
    from parashift.quantization.fp8 import dequantize, quantize_rows
    narrow = case.pop("narrow", False)
    x, weights, ids, gate_up, down, first = inputs(**case, dtype=dtype, device=device)
    (gate_up, gate_up_scale), (down, down_scale) = quantize_rows(gate_up), quantize_rows(down)
    if narrow:
        half = case["inter"] // 2
        gate_up = gate_up.unflatten(1, (2, case["inter"]))[:, :, half:]
        gate_up_scale = gate_up_scale.unflatten(1, (2, case["inter"]))[:, :, half:]
        down = down[:, :, half:]
    scales = (gate_up_scale, down_scale)
    fp32 = torch.float32
    ref = expert_outputs(x.to(fp32), weights.to(fp32), ids,
                         dequantize(gate_up, gate_up_scale, fp32),
                         dequantize(down, down_scale, fp32), first).to(x.dtype)
    tol = {"float32": TOLERANCE["float32"], "float16": TOLERANCE["bfloat16"],
           "bfloat16": 5e-2}[dtype]
    for forced in (None, TILES[tiles]):
        out = moe_small.small_experts(x, weights, ids, gate_up, down, first, scales, forced)
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    grouped = fused_moe.grouped_experts(x, weights, ids, gate_up, down, first, scales)
    torch.testing.assert_close(out, grouped, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


FP8_CASES = [CASES[0], CASES[2], CASES[5], CASES[7]]
test_fp8_interpreted, test_fp8_cuda = case_tests(__name__, check_fp8, FP8_CASES, uses_dot=True,
                                                 variants_in_one_dtype=True)


def test_few_pairs_take_the_small_path(monkeypatch):
    monkeypatch.setattr(moe_small, "MAX_PAIRS", 16)
    monkeypatch.setattr(moe_small, "MAX_PAIRS_FP8", 128)
    assert moe_small.takes(8) and moe_small.takes(16)
    assert not moe_small.takes(0) and not moe_small.takes(17)
    assert moe_small.takes(128, fp8=True) and not moe_small.takes(129, fp8=True)
    monkeypatch.setattr(moe_small, "MAX_PAIRS", 0)  # PARASHIFT_MOE_SMALL=0
    monkeypatch.setattr(moe_small, "MAX_PAIRS_FP8", 0)
    assert not moe_small.takes(8) and not moe_small.takes(8, fp8=True)


@pytest.mark.parametrize("value, pairs", [
    ("0", (0, 0)), ("1", (moe_small.DEFAULT_MAX_PAIRS, moe_small.DEFAULT_MAX_PAIRS_FP8)),
    ("64", (64, 64))])
def test_switch_reads_the_environment(monkeypatch, value, pairs):
    monkeypatch.setenv("PARASHIFT_MOE_SMALL", value)
    assert moe_small._max_pairs_from_env() == pairs


def test_a_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PARASHIFT_MOE_SMALL", "on")
    with pytest.raises(ValueError, match="PARASHIFT_MOE_SMALL"):
        moe_small._max_pairs_from_env()


def test_tiles_fill_the_device():
    """At one token of the Qwen3-30B-A3B shape both kernels get two programs per SM or more,
    with K steps that divide its dims, for bf16 and FP8 experts."""
    for weight_bytes in (2, 1):
        up, down = moe_small.choose_tiles(1, 8, 768, 2048, weight_bytes, torch.device("cpu"))
        assert 8 * (768 // up[0]) >= 2 * 132 and 2048 // down[0] >= 2 * 128
        assert 2048 % up[1] == 0 and 768 % down[1] == 0


def test_tiles_from_the_environment(monkeypatch):
    monkeypatch.setenv("PARASHIFT_MOE_SMALL_TILES", "16,256,4,8,128,8")
    assert moe_small._tiles_from_env() == ((16, 256, 4), (8, 128, 8))
    monkeypatch.setenv("PARASHIFT_MOE_SMALL_TILES", "16,250,4,8,128,8")
    with pytest.raises(ValueError, match="PARASHIFT_MOE_SMALL_TILES"):
        moe_small._tiles_from_env()


@cuda
def test_dispatch_and_cuda_graph_replay():
    """fused_experts takes the small path at a few pairs; a captured step replays new
    routing as it runs eagerly."""
    from parashift.layers.fused_moe import route
    x, weights, ids, gate_up, down, first = inputs(2, 128, 8, 256, 96, dtype="bfloat16",
                                                   device="cuda")
    assert moe_small.takes(ids.numel())
    logits = torch.randn(2, 128, device="cuda")

    def step():
        w, i = route(logits.to(x.dtype), 8, renormalize=True)
        return fused_moe.fused_experts(x, w, i, gate_up, down, first)
    assert_graph_replays(step, [x, logits])
