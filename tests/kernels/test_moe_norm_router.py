"""The post-attention add + RMSNorm and the MoE router in one launch
(kernels/moe_norm_router.py) against the PyTorch path: add_rms_norm_torch, then
moe_routing.route of the normalised row's logits (summed in float64, rounded to the
activations' dtype: one fp32 sum in any order rounds to the same 16-bit logit but at a
rounding boundary). On CUDA, the normalised row also bit for bit against kernels/rmsnorm.py
(same layout), and a captured graph replays new rows."""
import pytest
import torch

from parashift.kernels import moe_norm_router, moe_routing
from parashift.layers.layernorm import add_rms_norm_torch
from tests.kernels.common import (assert_exact, assert_graph_replays, case_tests, cuda,
                                  cuda_tests, randn)

EPS = 1e-6
# hidden (not a power of two: masked), experts (not a power of two: masked), top-k
CASES = [dict(hidden=40, experts=12, top_k=4, renormalize=True)]
CUDA_CASES = [dict(hidden=2048, experts=128, top_k=8, renormalize=True),  # Qwen3-30B-A3B
              dict(hidden=4096, experts=8, top_k=2, renormalize=True),  # Mixtral
              dict(hidden=2050, experts=60, top_k=4, renormalize=False)]
TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}


def inputs(hidden, experts, dtype, device):
    x = randn((1, hidden), dtype, device, seed=1)
    residual = randn((1, hidden), dtype, device, seed=2, scale=4.0)
    norm_weight = 1.0 + randn((hidden,), dtype, device, seed=3, scale=0.1)
    router = randn((experts, hidden), dtype, device, seed=4, scale=hidden ** -0.5)
    return x, residual, norm_weight, router


def check(hidden, experts, top_k, renormalize, dtype="float32", device="cpu"):
    x, residual, norm_weight, router = inputs(hidden, experts, dtype, device)
    out, new_x, weights, ids = moe_norm_router.norm_router(x, residual, norm_weight, EPS,
                                                           router, top_k, renormalize)
    ref_out, ref_new_x = add_rms_norm_torch(x, residual, norm_weight, EPS)
    assert_exact(new_x, ref_new_x)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    if device == "cuda":
        from parashift.kernels import rmsnorm
        assert_exact(out, rmsnorm.add_rms_norm(x, residual, norm_weight, EPS)[0])
    logits = (out.double() @ router.double().T).float().to(out.dtype)
    ref_weights, ref_ids = moe_routing.route(logits, top_k, renormalize)
    assert_exact(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, atol=tol, rtol=tol)
    again = moe_norm_router.norm_router(x, residual, norm_weight, EPS, router, top_k,
                                        renormalize)
    assert_exact(again[3], ids)  # the ticket counter was left at 0


test_interpreted, _ = case_tests(__name__, check, CASES)
test_cuda = cuda_tests(check, CUDA_CASES)


def test_fits_one_contiguous_row(monkeypatch):
    x, residual, norm_weight, router = inputs(64, 16, "float32", "cpu")
    assert moe_norm_router.fits(x, residual, norm_weight, router, 4)
    assert not moe_norm_router.fits(x.expand(2, 64), residual.expand(2, 64), norm_weight,
                                    router, 4)
    assert not moe_norm_router.fits(x, residual, norm_weight, router.half(), 4)
    assert not moe_norm_router.fits(x, residual, norm_weight, router, 6)  # k not a power of 2
    with pytest.raises(ValueError, match="norm_router takes one contiguous row"):
        moe_norm_router.norm_router(x, residual, norm_weight, EPS, router, 6, True)
    assert moe_norm_router.enabled()  # the default
    monkeypatch.setenv(moe_norm_router.ENV, "yes")
    with pytest.raises(ValueError, match=moe_norm_router.ENV):
        moe_norm_router.enabled()


@cuda
def test_cuda_graph_replays_new_rows():
    x, residual, norm_weight, router = inputs(2048, 128, "bfloat16", "cuda")
    assert_graph_replays(lambda: torch.cat([t.float().flatten() for t in
                                            moe_norm_router.norm_router(
                                                x, residual, norm_weight, EPS, router, 8,
                                                True)]), [x, residual])
