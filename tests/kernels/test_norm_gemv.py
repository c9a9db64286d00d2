"""The choice of the RMSNorm inside the next layer's GEMV (kernels/norm_gemv.py): by fake
timings on the CPU; on CUDA measured, and the fused output the unfused pair's up to the last
bits of 1 / rms."""
import pytest
import torch

from parashift.kernels import fp8_gemm, gated_gemv, norm_gemv, skinny_gemm
from tests.kernels.common import cuda, randn
from tests.kernels.test_gemm_timing import few_configs


@pytest.fixture
def fake_timings(monkeypatch):
    """Timings where the fused configs cost `costs[config]` (2.0 unless set) against 1.0
    unfused; records the shapes measured."""
    costs, measured = {}, []

    def timings(x, residual, norm_weight, eps, weight, scale, bias, silu_config, configs):
        measured.append((tuple(x.shape), residual is not None, silu_config))
        return {None: 1.0, **{c: costs.get(c, 2.0) for c in configs}}
    monkeypatch.setattr(norm_gemv, "timings_ms", timings)
    monkeypatch.setattr(norm_gemv, "unfused_linear", lambda *args: None)
    monkeypatch.setattr(norm_gemv, "_choices", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return costs, measured


@pytest.mark.parametrize("fp8", [True, False])
def test_the_fusion_is_chosen_only_where_it_measured_faster(fake_timings, monkeypatch, fp8):
    costs, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=fp8_gemm.FP8 if fp8 else torch.bfloat16)
    x, nw = torch.zeros(1, 32, dtype=torch.bfloat16), torch.ones(32, dtype=torch.bfloat16)
    assert norm_gemv.choice(x, x, nw, 1e-5, weight, None, None) is None  # slower
    fast = norm_gemv.candidates(weight)[-1]
    assert fast in norm_gemv.CONFIGS
    costs[fast] = 0.5
    assert norm_gemv.choice(x, x, nw, 1e-5, weight, None, None) is None  # cached
    assert norm_gemv.choice(x, None, nw, 1e-5, weight, None, None) == fast  # no residual
    monkeypatch.setattr(norm_gemv, "FUSED_ROWS", 4)
    assert norm_gemv.choice(x.repeat(4, 1), x.repeat(4, 1), nw, 1e-5, weight, None,
                            None) == fast
    assert measured == [((1, 32), True, None), ((1, 32), False, None), ((4, 32), True, None)]
    assert all(c.block_n % 2 == 0 for c in norm_gemv.candidates(weight))
    assert len(norm_gemv.chosen()) == 3


def test_what_the_gemv_cannot_serve_or_a_capture_takes_the_unfused_path(fake_timings,
                                                                        monkeypatch):
    _, measured = fake_timings
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    x, nw = torch.zeros(1, 32, dtype=torch.bfloat16), torch.ones(32, dtype=torch.bfloat16)
    assert norm_gemv.choice(x.repeat(norm_gemv.FUSED_ROWS + 1, 1), None, nw, 1e-5, weight,
                            None, None) is None
    assert norm_gemv.choice(x, None, nw.float(), 1e-5, weight, None, None) is None
    assert norm_gemv.choice(x, x.float(), nw, 1e-5, weight, None, None) is None
    assert norm_gemv.choice(x, None, nw, 1e-5, weight.t(), None, None) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert norm_gemv.choice(x, None, nw, 1e-5, weight, None, None) is None
    assert measured == []


@cuda
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("fp8", [True, False])
def test_the_measured_choice_gives_the_unfused_output(fp8, silu, monkeypatch):
    few_configs(monkeypatch)
    monkeypatch.setattr(norm_gemv, "CONFIGS", (norm_gemv.Config(8, 1024, 4),
                                               norm_gemv.Config(16, 512, 4)))
    for module in (norm_gemv, gated_gemv, fp8_gemm, skinny_gemm):
        monkeypatch.setattr(module, "_choices", {})
    k = 2048
    x, r = randn((1, k), "bfloat16", "cuda", scale=3.0), randn((1, k), "bfloat16", "cuda", 1)
    nw = randn((k,), "bfloat16", "cuda", seed=2, scale=0.1) + 1
    weight = randn((1024, k), "bfloat16", "cuda", seed=3, scale=k ** -0.5)
    scale = None
    if fp8:
        scale = torch.full((1024, 1), 2 ** -6, device="cuda")
        weight = (weight.float() / scale).to(fp8_gemm.FP8)
    silu_config = None  # a SiLU GEMV config as gated_gemv's choice would give it
    if silu:
        silu_config = (fp8_gemm.Config("gemv", 4, 1024, 4, 1) if fp8 else
                       skinny_gemm.GemvConfig(4, 1024, 4))
    config = norm_gemv.choice(x, r, nw, 1e-5, weight, scale, None, silu_config)
    assert len(norm_gemv.chosen()) == 1
    unfused, added = norm_gemv.unfused_linear(x, r, nw, 1e-5, weight, scale, None, silu_config)
    assert torch.equal(added, x + r)
    for c in [config] + norm_gemv.candidates(weight)[:2]:
        if c is None:
            continue
        fused, new_residual = norm_gemv.fused_linear(x, r, nw, 1e-5, weight, scale, None, c,
                                                     silu)
        assert torch.equal(new_residual, added)
        torch.testing.assert_close(fused, unfused, rtol=2 ** -6, atol=2 ** -6)
