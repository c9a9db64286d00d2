"""The prefill path of the MoE experts (kernels/moe_prefill.py through
fused_moe.prefill_experts: SiLU·mul in the gate_up GEMM, no fills, the top-k sum kernel)
against the PyTorch path, layers.fused_moe.expert_outputs, and against the unfused grouped
path (the same bits under the interpreter): under the Triton interpreter on the CPU and
compiled on CUDA, with idle experts, experts held elsewhere (EP: their pairs' rows never
written), narrowed strided weights, FP8 experts and a CUDA-graph replay."""
import json

import pytest
import torch

from parashift.kernels import fused_moe, moe_decode, moe_prefill, moe_schedule
from parashift.layers.fused_moe import expert_outputs, route
from tests.kernels.common import assert_exact, case_tests, cuda, cuda_tests
from tests.kernels.test_fused_moe import TOLERANCE, inputs

# small tiles so that small cases run many blocks; inter / hidden not multiples of them
TILES = {"block_m": 16, "gate_up": (32, 32, 4, 2), "down": (32, 32, 4, 2)}
CASES = [
    dict(tokens=37, experts=8, top_k=2, hidden=64, inter=48),
    dict(tokens=20, experts=6, top_k=3, hidden=40, inter=24, crowd=True),
    dict(tokens=33, experts=8, top_k=2, hidden=64, inter=32, held=3, first=4),
    dict(tokens=70, experts=4, top_k=2, hidden=64, inter=32, held=2, first=2, crowd=True),
    dict(tokens=17, experts=4, top_k=2, hidden=64, inter=64, narrow=True),
    # every schedule flag (kernels/moe_schedule.py): half blocks at each expert's tail
    dict(tokens=130, experts=4, top_k=4, hidden=64, inter=32,
         schedule=dict(block_m=32, n_first=1, split_tail=1, tma=1, joint=1)),
]
# on CUDA: the H200's prefill tiles under each flag, experts of 1-3 blocks and a tail
SCHEDULE_CASES = [dict(tokens=300, experts=8, top_k=4, hidden=256, inter=192, schedule=dict(
    block_m=128, gate_up=(64, 64, 4, 3), down=(128, 64, 8, 3), **flags))
    for flags in (dict(n_first=1), dict(split_tail=1), dict(tma=1),
                  dict(n_first=1, split_tail=1, tma=1), dict(joint=1))]


def unfused(args):
    """grouped_experts' unfused path (zeroed GEMM outputs, silu_and_mul, torch's sum) at
    TILES' block rows."""
    x, weights, ids, gate_up, down, first = args
    from parashift.kernels.silu_mul import silu_and_mul
    pair_of_row, block_expert = fused_moe.sort_pairs(ids, gate_up.shape[0], first,
                                                     TILES["block_m"])
    h = silu_and_mul(fused_moe.grouped_gemm(x, gate_up, pair_of_row, block_expert, ids.numel(),
                                            ids.shape[1], tiles=TILES["gate_up"]))
    y = fused_moe.grouped_gemm(h, down, pair_of_row, block_expert, ids.numel(), 1,
                               weights.flatten().contiguous(), TILES["down"])
    return y.view(*ids.shape, -1).sum(dim=1)


def check(dtype="float32", device="cpu", schedule=None, **case):
    args = inputs(**case, dtype=dtype, device=device)
    out = fused_moe.prefill_experts(*args, tiles={**TILES, **(schedule or {})})
    ref = expert_outputs(*args)
    torch.testing.assert_close(out, ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    if device == "cpu" and not schedule:  # one summation order whatever the tiles (numpy's
        assert_exact(out, unfused(args))  # at any one number of rows a block)
    else:
        torch.testing.assert_close(out, unfused(args), atol=TOLERANCE[dtype],
                                   rtol=TOLERANCE[dtype])


test_interpreted, test_cuda = case_tests(__name__, check, CASES, uses_dot=True,
                                         variants_in_one_dtype=True)


def check_schedule(dtype="float32", device="cpu", schedule=None, **case):
    """The same bits as the same tiles with every flag off (a flag changes which program
    computes a row and how its weights arrive, never a row's sums), and those near the
    PyTorch path's (outputs of ~30 here: the reference's bf16 index_add rounds each of the k
    terms, so the tolerance scales with the outputs)."""
    args = inputs(**case, dtype=dtype, device=device)
    plain = {key: value for key, value in schedule.items() if key not in moe_schedule.FLAGS}
    out = fused_moe.prefill_experts(*args, tiles={**TILES, **plain})
    assert_exact(fused_moe.prefill_experts(*args, tiles={**TILES, **schedule}), out)
    ref = expert_outputs(*args)
    torch.testing.assert_close(out, ref, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype] * float(ref.abs().max()))


test_schedules_cuda = cuda_tests(check_schedule, SCHEDULE_CASES)


def check_fp8(dtype="float32", device="cpu", **case):
    from parashift.quantization.fp8 import quantize_rows
    x, weights, ids, gate_up, down, first = inputs(**case, dtype=dtype, device=device)
    (gate_up, gate_up_scale), (down, down_scale) = quantize_rows(gate_up), quantize_rows(down)
    scales = (gate_up_scale, down_scale)
    out = fused_moe.prefill_experts(x, weights, ids, gate_up, down, first, scales, tiles=TILES)
    pair_of_row, block_expert = fused_moe.sort_pairs(ids, gate_up.shape[0], first, 16)
    from parashift.kernels.silu_mul import silu_and_mul
    h = silu_and_mul(fused_moe.grouped_gemm(x, gate_up, pair_of_row, block_expert, ids.numel(),
                                            ids.shape[1], tiles=TILES["gate_up"],
                                            w_scale=gate_up_scale))
    y = fused_moe.grouped_gemm(h, down, pair_of_row, block_expert, ids.numel(), 1,
                               weights.flatten().contiguous(), TILES["down"], down_scale)
    ref = y.view(*ids.shape, -1).sum(dim=1)
    if device == "cpu":
        assert_exact(out, ref)
    else:
        torch.testing.assert_close(out, ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


test_fp8_interpreted, test_fp8_cuda = case_tests(__name__, check_fp8, [CASES[0], CASES[3]],
                                                 uses_dot=True)


@cuda
def test_fp8_experts_under_the_flags_keep_their_bits():
    """FP8 experts (pointer loads: no TMA for E4M3 weights) with n_first and split_tail give
    the plain tiles' bits."""
    from parashift.quantization.fp8 import quantize_rows
    case = {key: value for key, value in SCHEDULE_CASES[0].items() if key != "schedule"}
    x, weights, ids, gate_up, down, first = inputs(**case, dtype="bfloat16", device="cuda")
    (gate_up, gate_up_scale), (down, down_scale) = quantize_rows(gate_up), quantize_rows(down)
    plain = {key: value for key, value in SCHEDULE_CASES[0]["schedule"].items()
             if key not in moe_schedule.FLAGS}
    outs = [fused_moe.prefill_experts(x, weights, ids, gate_up, down, first,
                                      (gate_up_scale, down_scale), tiles={**plain, **flags})
            for flags in ({}, dict(n_first=1, split_tail=1, tma=1))]
    assert_exact(outs[1], outs[0])


def check_topk_sum(tokens, top_k, n, dtype="float32", device="cpu"):
    """Rows of pairs routed to other ranks' experts hold garbage (never written): skipped;
    the others added in slot order in fp32, rounded once."""
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, 8, (tokens, top_k), generator=gen)
    y = torch.randn(tokens * top_k, n, generator=gen).to(getattr(torch, dtype))
    held = (ids >= 2) & (ids < 6)  # experts 2..5 here
    y[~held.flatten()] = float("nan")
    out = moe_prefill.topk_sum(y.to(device), ids.to(device), first_expert=2, num_local=4)
    expected = torch.zeros(tokens, n)
    for slot in range(top_k):
        expected += torch.where(held[:, slot, None], y.view(tokens, top_k, n)[:, slot].float(), 0)
    assert_exact(out.cpu(), expected.to(y.dtype))


test_topk_sum_interpreted, test_topk_sum_cuda = case_tests(
    __name__, check_topk_sum, [dict(tokens=9, top_k=8, n=100), dict(tokens=3, top_k=2, n=2100)])


def test_prefill_batches_take_the_prefill_path(monkeypatch):
    calls = []
    monkeypatch.setattr(fused_moe, "prefill_experts", lambda *a: calls.append(a) or "prefill")
    monkeypatch.setattr(fused_moe, "sort_pairs", lambda *a: calls.append("unfused") or 1 / 0)
    args = inputs(tokens=130, experts=4, top_k=2, hidden=32, inter=16)  # 65 pairs an expert
    assert fused_moe.grouped_experts(*args) == "prefill"
    monkeypatch.setenv(moe_prefill.ENV, "0")
    with pytest.raises(ZeroDivisionError):
        fused_moe.grouped_experts(*args)
    assert calls[-1] == "unfused" and len(calls) == 2
    few = inputs(tokens=100, experts=4, top_k=2, hidden=32, inter=16)  # 50 pairs an expert
    monkeypatch.setenv(moe_prefill.ENV, "1")
    monkeypatch.setenv(moe_decode.ENV, "0")  # a decode-sized batch: the grouped GEMMs
    with pytest.raises(ZeroDivisionError):
        fused_moe.grouped_experts(*few)
    monkeypatch.setenv(moe_decode.ENV, "1")  # ... or the prefill kernels at decode tiles
    assert fused_moe.grouped_experts(*few) == "prefill"
    assert len(calls[-1]) == 8 and calls[-1][-1] == moe_decode.tiles_for(16, 32)
    monkeypatch.setenv(moe_prefill.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_MOE_PREFILL"):
        fused_moe.grouped_experts(*args)


def test_tiles_come_from_the_sweeps_file(monkeypatch, tmp_path):
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"block_m": 128, "gate_up": [64, 64, 8, 3],
                                "down": [128, 64, 8, 4]}))
    monkeypatch.setenv(moe_prefill.TILES_ENV, str(path))
    assert moe_prefill.tiles_for(torch.device("cpu")) == {
        "block_m": 128, "gate_up": (64, 64, 8, 3), "down": (128, 64, 8, 4)}
    monkeypatch.delenv(moe_prefill.TILES_ENV)
    assert moe_prefill.tiles_for(torch.device("cpu")) == moe_prefill.DEFAULT_TILES
    monkeypatch.setitem(moe_prefill.TILES, "cpu", {"block_m": 128, "gate_up": (64, 64, 4, 3),
                                                   "down": (256, 64, 8, 3)})
    assert moe_prefill.tiles_for(torch.device("cpu"), 256)["block_m"] == 128
    assert moe_prefill.tiles_for(torch.device("cpu"), 100) == moe_prefill.DEFAULT_TILES
    flagged = tmp_path / "flagged.json"  # (a file's tiles are read once)
    flagged.write_text(json.dumps({"block_m": 128, "gate_up": [64, 64, 8, 3],
                                   "down": [128, 64, 8, 4], "n_first": 1, "tma": 0}))
    monkeypatch.setenv(moe_prefill.TILES_ENV, str(flagged))
    assert moe_prefill.tiles_for(torch.device("cpu"))["n_first"] == 1
    with pytest.raises(ValueError, match="0 or 1"):
        moe_prefill.check_tiles({**moe_prefill.DEFAULT_TILES, "split_tail": 2})
    with pytest.raises(ValueError, match="unknown"):
        moe_prefill.check_tiles({**moe_prefill.DEFAULT_TILES, "persistent": 1})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"block_m": 48, "gate_up": [64, 64, 8, 3], "down": [1, 2, 3, 4]}))
    monkeypatch.setenv(moe_prefill.TILES_ENV, str(bad))
    with pytest.raises(ValueError, match="powers of two"):
        moe_prefill.tiles_for(torch.device("cpu"))


@cuda
def test_cuda_graph_replays_new_routing():
    from tests.kernels.common import assert_graph_replays
    x, weights, ids, gate_up, down, first = inputs(300, 4, 2, 64, 32, dtype="bfloat16",
                                                   device="cuda")
    logits = torch.randn(300, 4, device="cuda")

    def step():
        w, i = route(logits.to(x.dtype), 2, renormalize=True)
        return fused_moe.prefill_experts(x, w, i, gate_up, down, first)
    assert_graph_replays(step, [x, logits])
