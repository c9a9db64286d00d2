"""The choice of SiLU-and-mul inside the gate_up GEMV (kernels/gated_gemv.py): by fake timings
on the CPU; on CUDA measured, and the fused output the unfused one's."""
import pytest
import torch

from parashift.kernels import fp8_gemm, gated_gemv, silu_mul, skinny_gemm
from tests.kernels.common import cuda, randn
from tests.kernels.test_gemm_timing import few_configs


@pytest.fixture
def fake_timings(monkeypatch):
    """Timings where the fused configs cost `costs[config]` (2.0 unless set) against 1.0
    unfused; records the shapes measured."""
    costs, measured = {}, []

    def timings(x, weight, scale, bias, configs):
        measured.append(tuple(x.shape))
        return {None: 1.0, **{c: costs.get(c, 2.0) for c in configs}}

    def dispatch_choice(x, weight, scale, bias):  # the first one-part GEMV config
        return next(c for c in configs_of(weight) if c.split_k == 1)
    monkeypatch.setattr(gated_gemv, "timings_ms", timings)
    monkeypatch.setattr(gated_gemv, "_dispatch_choice", dispatch_choice)
    monkeypatch.setattr(gated_gemv, "unfused_linear", lambda *args: None)
    monkeypatch.setattr(gated_gemv, "_choices", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return costs, measured


def configs_of(weight: torch.Tensor) -> tuple:
    return fp8_gemm.GEMV_CONFIGS if weight.dtype == fp8_gemm.FP8 else skinny_gemm.GEMV_CONFIGS


@pytest.mark.parametrize("fp8", [True, False])
def test_a_fusion_is_chosen_only_where_it_measured_faster(fake_timings, fp8):
    costs, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=fp8_gemm.FP8 if fp8 else torch.bfloat16)
    assert gated_gemv.choice(torch.zeros(1, 32), weight, None, None) is None  # slower
    unfused = next(c for c in configs_of(weight) if c.split_k == 1)
    fast = gated_gemv.candidates(weight, unfused)[-1]
    assert fast in configs_of(weight)
    costs[fast] = 0.5
    assert gated_gemv.choice(torch.zeros(1, 32), weight, None, None) is None  # cached
    assert gated_gemv.choice(torch.zeros(2, 32), weight, None, None) == fast
    assert measured == [(1, 32), (2, 32)]


@pytest.mark.parametrize("fp8", [True, False])
def test_gate_up_keeps_the_unfused_gemv_sums_and_an_even_weight(fake_timings, fp8):
    weight = torch.zeros(64, 32, dtype=fp8_gemm.FP8 if fp8 else torch.bfloat16)
    for unfused in configs_of(weight):
        same_sums = gated_gemv.candidates(weight, unfused)
        if unfused.split_k > 1:  # its sums come in parts: no one-part config has them
            assert not same_sums
            continue
        assert unfused in same_sums and all(
            (c.block_k, c.num_warps, c.split_k) == (unfused.block_k, unfused.num_warps, 1)
            for c in same_sums)
    for other in (None, skinny_gemm.CONFIGS[0], fp8_gemm.CONFIGS[0]):  # cuBLAS, tl.dot
        assert gated_gemv.candidates(weight, other) == []
    assert gated_gemv.choice(torch.zeros(1, 32), weight[:63], None, None) is None


def test_more_rows_than_the_gemv_serves_or_a_capture_take_the_unfused_path(fake_timings,
                                                                           monkeypatch):
    _, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    assert gated_gemv.choice(torch.zeros(5, 32), weight, None, None) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert gated_gemv.choice(torch.zeros(1, 32), weight, None, None) is None
    assert measured == []


@cuda
@pytest.mark.parametrize("fp8", [True, False])
def test_the_measured_choice_gives_the_unfused_output(fp8, monkeypatch):
    few_configs(monkeypatch)
    for module in (gated_gemv, fp8_gemm, skinny_gemm):
        monkeypatch.setattr(module, "_choices", {})
    k = 1024
    x = randn((1, k), "bfloat16", "cuda", scale=3.0)
    weight = randn((512, k), "bfloat16", "cuda", scale=k ** -0.5)
    scale = None
    if fp8:
        scale = torch.full((512, 1), 2 ** -6, device="cuda")
        weight = (weight.float() / scale).to(fp8_gemm.FP8)
    config = gated_gemv.choice(x, weight, scale, None)
    assert len(gated_gemv.chosen()) == 1
    unfused = gated_gemv.unfused_linear(x, weight, scale, None)
    if config is not None:  # the unfused GEMV's sums: the same bits
        assert torch.equal(gated_gemv.fused_linear(x, weight, scale, None, config), unfused)
    dense = weight.float() * (1 if scale is None else scale)
    expected = silu_mul.silu_and_mul(
        torch.nn.functional.linear(x.float(), dense).to(x.dtype)).float()
    torch.testing.assert_close(unfused.float(), expected, rtol=3e-2, atol=3e-2)
