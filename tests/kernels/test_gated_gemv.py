"""The choice of SiLU-and-mul inside the down projection's GEMV (kernels/gated_gemv.py): by
fake timings on the CPU; on CUDA measured, and the chosen kernel's output the unfused one's."""
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

    def timings(x, weight, scale, bias):
        measured.append(tuple(x.shape))
        return {None: 1.0, **{c: costs.get(c, 2.0) for c in gated_gemv.candidates(weight)}}
    monkeypatch.setattr(gated_gemv, "timings_ms", timings)
    monkeypatch.setattr(gated_gemv, "unfused_linear", lambda *args: None)
    monkeypatch.setattr(gated_gemv, "_choices", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return costs, measured


@pytest.mark.parametrize("fp8", [True, False])
def test_the_fused_gemv_is_chosen_only_where_it_measured_faster(fake_timings, fp8):
    costs, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=fp8_gemm.FP8 if fp8 else torch.bfloat16)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    assert gated_gemv.choice(x, weight, None, None) is None  # every config slower
    fast = gated_gemv.candidates(weight)[-1]
    assert fast in (*(fp8_gemm.GEMV_CONFIGS if fp8 else skinny_gemm.GEMV_CONFIGS),
                    *gated_gemv.WIDE_CONFIGS)
    costs[fast] = 0.5
    assert gated_gemv.choice(x, weight, None, None) is None  # cached per shape
    assert gated_gemv.choice(torch.zeros(2, 64, dtype=torch.bfloat16), weight, None,
                             None) == fast
    assert measured == [(1, 64), (2, 64)]


def test_more_rows_than_the_gemv_serves_or_a_capture_take_the_unfused_path(fake_timings,
                                                                           monkeypatch):
    _, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    assert gated_gemv.choice(torch.zeros(5, 64), weight, None, None) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert gated_gemv.choice(torch.zeros(1, 64), weight, None, None) is None
    assert measured == []


@cuda
@pytest.mark.parametrize("fp8", [True, False])
def test_the_measured_choice_gives_the_unfused_output(fp8, monkeypatch):
    few_configs(monkeypatch)
    for module in (gated_gemv, fp8_gemm, skinny_gemm):
        monkeypatch.setattr(module, "_choices", {})
    x = randn((1, 2 * 1024), "bfloat16", "cuda", scale=3.0)
    weight = randn((512, 1024), "bfloat16", "cuda", scale=1024 ** -0.5)
    scale = None
    if fp8:
        scale = torch.full((512, 1), 2 ** -6, device="cuda")
        weight = (weight.float() / scale).to(fp8_gemm.FP8)
    config = gated_gemv.choice(x, weight, scale, None)
    assert len(gated_gemv.chosen()) == 1
    unfused = gated_gemv.unfused_linear(x, weight, scale, None)
    if config is not None:
        fused = gated_gemv.gated_linear(x, weight, scale, None, config)
        torch.testing.assert_close(fused, unfused, rtol=2 ** -7, atol=2 ** -7)
    expected = torch.nn.functional.linear(silu_mul.silu_and_mul(x).float(), weight.float() * (
        1 if scale is None else scale))
    torch.testing.assert_close(unfused.float(), expected, rtol=2e-2, atol=2e-2)
