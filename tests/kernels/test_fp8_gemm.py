"""The FP8-weight GEMM against a dequantized reference (CUDA; Triton's interpreter has no
FP8 casts)."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
fp8_gemm = pytest.importorskip("parashift.kernels.fp8_gemm")


def quantized(n, k, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5
    scale = w.abs().amax(1, keepdim=True) / fp8_gemm.FP8_MAX
    return (w / scale).to(fp8_gemm.FP8), scale


@pytest.mark.parametrize("m", [1, 3, 16, 17, 64])
@pytest.mark.parametrize("n,k", [(96, 256), (200, 320), (64, 1000)])
@pytest.mark.parametrize("config", [c for c in fp8_gemm.CONFIGS if c.block_n <= 32])
@pytest.mark.parametrize("bias", [False, True])
def test_triton_kernel_matches_dequantized(m, n, k, config, bias):
    w, scale = quantized(n, k, seed=m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    expected = torch.nn.functional.linear(x.float(), w.float() * scale,
                                          None if b is None else b.float())
    actual = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
    # FP8 activations (w8a8) round each to 3 mantissa bits: a looser bound
    tol = 2e-2 if config.kernel == "w8" else 1.5e-1
    torch.testing.assert_close(actual.float(), expected, atol=tol, rtol=tol)
    relative = (actual.float() - expected).norm() / expected.norm()
    assert relative < (1e-2 if config.kernel == "w8" else 5e-2)


@pytest.mark.parametrize("m", [1, 40, 300])
def test_linear_picks_a_kernel_that_matches(m):
    w, scale = quantized(512, 1024)
    x = torch.randn(2, m, 1024, device="cuda", dtype=torch.bfloat16)
    expected = x.float() @ (w.float() * scale).t()
    actual = fp8_gemm.linear(x, w, scale, None)
    assert actual.shape == (2, m, 512)
    # FP8 activations round to 3 mantissa bits: the error relative to the output's norm
    assert (actual.float() - expected).norm() / expected.norm() < 5e-2


def test_rows_quantized_in_one_kernel_match_torch():
    x = torch.randn(5, 1000, device="cuda", dtype=torch.bfloat16) * 3
    x[2] = 0
    q, scale = fp8_gemm.quantize_rows(x)
    expected_scale = x.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / fp8_gemm.FP8_MAX
    torch.testing.assert_close(scale, expected_scale)
    torch.testing.assert_close(q.float(), (x.float() / expected_scale).to(fp8_gemm.FP8).float())
