"""The fused MoE kernel (grouped GEMMs over expert-sorted pairs) against the PyTorch path
it replaces, layers.fused_moe.expert_outputs: under the Triton interpreter on the CPU
(float32, float16) and compiled on CUDA, with idle experts, experts held elsewhere (EP),
a narrowed layout's strided weights, and a CUDA-graph replay on new routing."""
import contextlib
import os

import pytest
import torch

from parashift.kernels import fused_moe, moe_decode
from parashift.layers.fused_moe import expert_outputs, route
from tests.kernels.common import case_tests, cuda, randn

# tokens, experts held here (of `experts`), first held, top-k, hidden, intermediate; crowd:
# every token picks experts 1 and 2 (the others idle); narrow: the experts are a 1/2 slice
CASES = [
    dict(tokens=1, experts=8, top_k=2, hidden=64, inter=32),
    dict(tokens=37, experts=8, top_k=2, hidden=64, inter=48),
    dict(tokens=20, experts=6, top_k=3, hidden=40, inter=24, crowd=True),
    dict(tokens=33, experts=8, top_k=2, hidden=64, inter=32, held=3, first=4),
    dict(tokens=5, experts=4, top_k=1, hidden=32, inter=16, held=2, first=0, crowd=True),
    dict(tokens=17, experts=4, top_k=2, hidden=64, inter=64, narrow=True),
    # 64+ pairs per expert: 64-row programs (a prefill's)
    dict(tokens=130, experts=4, top_k=2, hidden=64, inter=32),
    dict(tokens=70, experts=4, top_k=2, hidden=64, inter=32, held=2, first=2, crowd=True),
]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def inputs(tokens, experts, top_k, hidden, inter, held=None, first=0, crowd=False,
           narrow=False, dtype="float32", device="cpu", seed=0):
    held = experts if held is None else held
    x = randn((tokens, hidden), dtype, device, seed=seed)
    logits = randn((tokens, experts), "float32", device, seed=seed + 1)
    if crowd:
        logits[:, [1, 2]] += 50.0
    weights, ids = route(logits.to(x.dtype), top_k, renormalize=True)
    gate_up = randn((held * 2 * inter, hidden), dtype, device, seed=seed + 2, scale=0.2)
    gate_up = gate_up.view(held, 2 * inter, hidden)
    down = randn((held * hidden, inter), dtype, device, seed=seed + 3, scale=0.2)
    down = down.view(held, hidden, inter)
    if narrow:  # the second half of each expert's width: strided views, as the shift plan's
        half = inter // 2
        gate_up = gate_up.unflatten(1, (2, inter))[:, :, half:]
        down = down[:, :, half:]
    return x, weights, ids, gate_up, down, first


def check(dtype="float32", device="cpu", **case):
    """grouped_experts (decode-sized batches through kernels/moe_decode.py's fused kernels,
    prefill-sized through moe_prefill's) against the torch path; on CUDA also the unfused
    path at 16 rows, which must round alike (only fp32 sums' order differs)."""
    args = inputs(**case, dtype=dtype, device=device)
    out = fused_moe.grouped_experts(*args)
    ref = expert_outputs(*args)
    torch.testing.assert_close(out, ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    if device == "cuda":
        with unfused_decode():
            unfused = fused_moe.grouped_experts(*args)
        torch.testing.assert_close(out, unfused, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@contextlib.contextmanager
def unfused_decode():
    """PARASHIFT_MOE_DECODE_FUSED=0 for the block."""
    before = os.environ.get(moe_decode.ENV)
    os.environ[moe_decode.ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[moe_decode.ENV]
        else:
            os.environ[moe_decode.ENV] = before


test_interpreted, test_cuda = case_tests(__name__, check, CASES, uses_dot=True,
                                         variants_in_one_dtype=True)

# FP8 experts (E4M3, a scale per output row) read as stored, against the dequantized experts
FP8_CASES = [CASES[1], CASES[3], CASES[5], CASES[7]]


def check_fp8(dtype="float32", device="cpu", **case):
    from parashift.quantization.fp8 import dequantize, quantize_rows
    narrow = case.pop("narrow", False)
    x, weights, ids, gate_up, down, first = inputs(**case, dtype=dtype, device=device)
    (gate_up, gate_up_scale), (down, down_scale) = quantize_rows(gate_up), quantize_rows(down)
    if narrow:  # the second half of each expert's width, weights and scales alike
        half = case["inter"] // 2
        gate_up = gate_up.unflatten(1, (2, case["inter"]))[:, :, half:]
        gate_up_scale = gate_up_scale.unflatten(1, (2, case["inter"]))[:, :, half:]
        down = down[:, :, half:]
    out = fused_moe.grouped_experts(x, weights, ids, gate_up, down, first,
                                  (gate_up_scale, down_scale))
    # in fp32: dequantized fp16 weights would round w * scale, which the kernel does not
    fp32 = torch.float32
    ref = expert_outputs(x.to(fp32), weights.to(fp32), ids, dequantize(gate_up, gate_up_scale, fp32),
                         dequantize(down, down_scale, fp32), first).to(x.dtype)
    # the kernel rounds each expert's [gate | up] and its down projection to fp16/bf16, the
    # fp32 reference does not: fp16 to bf16's tolerance, bf16 to 5e-2 (on an H200 2 of 2,368
    # elements of a case were 0.029-0.047 off)
    tol = {"float32": TOLERANCE["float32"], "float16": TOLERANCE["bfloat16"],
           "bfloat16": 5e-2}[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


test_fp8_interpreted, test_fp8_cuda = case_tests(__name__, check_fp8, FP8_CASES, uses_dot=True)


def test_sorted_rows_cover_each_held_pair_once():
    """Every pair routed to a held expert sits in one row of its expert's blocks; the rest
    of the rows are padding (sentinel) and the blocks past the end have no expert."""
    ids = torch.tensor([[1, 4], [4, 5], [0, 4], [7, 1]])
    rows, block_expert = fused_moe.sort_pairs(ids, num_local=4, first_expert=1, block_m=2)
    held = [p for p, e in enumerate(ids.flatten().tolist()) if 1 <= e < 5]
    real = rows[rows < ids.numel()].tolist()
    assert sorted(real) == held
    for block, expert in enumerate(block_expert.tolist()):
        for pair in rows[2 * block:2 * block + 2].tolist():
            if pair < ids.numel():
                assert ids.flatten()[pair] - 1 == expert
    # expert 0 (id 1: 2 pairs) and expert 3 (id 4: 3 pairs): 1 + 2 blocks, then none
    assert block_expert.tolist()[:3] == [0, 3, 3]
    assert all(e == 4 for e in block_expert.tolist()[3:])


@cuda
def test_cuda_graph_replays_new_routing():
    from tests.kernels.common import assert_graph_replays
    x, weights, ids, gate_up, down, first = inputs(8, 8, 2, 64, 32, dtype="bfloat16",
                                                   device="cuda")
    logits = torch.randn(8, 8, device="cuda")

    def step():
        w, i = route(logits.to(x.dtype), 2, renormalize=True)
        return fused_moe.grouped_experts(x, w, i, gate_up, down, first)
    assert_graph_replays(step, [x, logits])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_layer_runs_kernel_on_cuda_only(monkeypatch, device):
    from parashift.layers import fused_moe as layer
    calls = []
    monkeypatch.setattr(fused_moe, "fused_experts", lambda *a: calls.append(a) or
                        expert_outputs(*a[:6]))  # a[6]: FP8 scales, None here
    args = inputs(4, 4, 2, 32, 16, device=device)
    layer.experts_forward(*args)
    assert len(calls) == (device == "cuda")


# tokens, experts, top-k, renormalize; held/first: the experts of this rank (EP)
ROUTING_CASES = [dict(tokens=1, experts=128, top_k=8, renormalize=True),
                 dict(tokens=16, experts=128, top_k=8, renormalize=True, held=32, first=64),
                 dict(tokens=9, experts=8, top_k=2, renormalize=False),
                 dict(tokens=5, experts=60, top_k=4, renormalize=True, held=15, first=0),
                 # more than 128 pairs: a program per expert counts, then places them
                 dict(tokens=300, experts=16, top_k=4, renormalize=True),
                 dict(tokens=70, experts=16, top_k=2, renormalize=False, held=6, first=5)]


def check_routing(tokens, experts, top_k, renormalize, held=None, first=0,
                  dtype="float32", device="cpu"):
    """The one-launch routing and pair sort against the torch ops they replace: the same
    expert ids and rows, weights up to the softmax sum's order."""
    from parashift.kernels import moe_routing
    logits = randn((tokens, experts), dtype, device, seed=tokens)
    weights, ids = moe_routing.route(logits, top_k, renormalize)
    ref_weights, ref_ids = route(logits, top_k, renormalize)
    assert torch.equal(ids, ref_ids)
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    torch.testing.assert_close(weights, ref_weights, rtol=tol, atol=tol)
    held = experts if held is None else held
    for block_m in (16, 64):
        rows, blocks = moe_routing.sort_pairs(ids, held, first, block_m)
        ref_rows, ref_blocks = fused_moe.sort_pairs_torch(ids, held, first, block_m)
        assert torch.equal(rows, ref_rows) and torch.equal(blocks, ref_blocks)


# uses_dot: the GPU image's Triton 3.6 interpreter fails on these too (the same "only
# 0-dimensional arrays" error as on tl.dot kernels); CI's 3.9 runs them
test_routing_interpreted, test_routing_cuda = case_tests(
    __name__, check_routing, ROUTING_CASES, uses_dot=True, variants_in_one_dtype=True)


def check_tie_order(tokens, experts, top_k, dtype="float32", device="cpu"):
    """Logits of few distinct values (many ties): the routing kernel picks the larger
    probability first and, among equal ones, the lower expert id (as the torch path's
    reference order), and renormalizes the picks."""
    from parashift.kernels import moe_routing
    gen = torch.Generator().manual_seed(experts)
    logits = torch.randint(0, 3, (tokens, experts), generator=gen).to(getattr(torch, dtype))
    weights, ids = moe_routing.route(logits.to(device), top_k, renormalize=True)
    for row, row_ids in zip(logits.tolist(), ids.tolist()):
        assert row_ids == sorted(range(experts), key=lambda e: (-row[e], e))[:top_k]
    torch.testing.assert_close(weights.float().sum(1), torch.ones(tokens, device=device),
                               rtol=1e-2, atol=0)


test_ties_interpreted, test_ties_cuda = case_tests(
    __name__, check_tie_order, [dict(tokens=5, experts=12, top_k=4)], uses_dot=True)


# the sort alone over random ids: many chunks of 1,024 pairs (each expert's pairs spread over
# them), EP's experts held elsewhere
SORT_CASES = [dict(tokens=600, experts=8, top_k=8, held=6, first=1),
              dict(tokens=300, experts=32, top_k=8, held=32, first=0)]


def check_sort(tokens, experts, top_k, held, first, dtype="float32", device="cpu"):
    from parashift.kernels import moe_routing
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen).to(device)
    for block_m in (16, 64):
        rows, blocks = moe_routing.sort_pairs(ids, held, first, block_m)
        ref_rows, ref_blocks = fused_moe.sort_pairs_torch(ids, held, first, block_m)
        assert torch.equal(rows, ref_rows) and torch.equal(blocks, ref_blocks)


test_sort_interpreted, test_sort_cuda = case_tests(__name__, check_sort, SORT_CASES,
                                                   uses_dot=True)


def test_prefill_sized_batches_take_64_row_programs():
    assert fused_moe.block_rows(num_pairs=8, num_local=128) == 16
    assert fused_moe.block_rows(num_pairs=512 * 8, num_local=128) == 16
    assert fused_moe.block_rows(num_pairs=4096 * 8, num_local=128) == 64


def test_routing_kernels_take_what_they_fit():
    from parashift.kernels import moe_routing
    assert moe_routing.route_fits(128, 8) and moe_routing.route_fits(8, 2)
    assert not moe_routing.route_fits(128, 6) and not moe_routing.route_fits(512, 8)
    assert moe_routing.sort_fits(4096 * 8, 128) and not moe_routing.sort_fits(8, 512)
