"""The FP8 GEMV whose last program adds the residual and normalises its output rows
(kernels/norm_tail.py) against the plain GEMV followed by the add-and-norm kernel: under the
Triton interpreter on the CPU and compiled on CUDA."""
import pytest
import torch

from parashift.kernels import fp8_gemm, norm_tail, rmsnorm, split_tickets
from parashift.kernels.fp8_gemv import fp8_gemv
from tests.kernels.common import (assert_exact, assert_fp8_rows, assert_graph_replays, case_tests,
                                  cuda, randn)
from tests.kernels.test_fp8_gemv import quantized

FP8 = torch.float8_e4m3fn


def check(m, n, k, bias=False, quant=False, dtype="float32", device="cpu",
          configs=((8, 64, 4, 1), (16, 32, 1, 1, 1, True))):
    """y the plain GEMV's bits; the new residual y + residual's; the normed rows the norm
    kernel's of it (bit for bit where the row is read in one chunk under the interpreter; on
    CUDA, or in several chunks, up to the last bits of 1 / rms), their E4M3 rows
    quantize_rows' of them; every counter back at 0."""
    weight, scale = quantized(n, k, False, device, seed=11)
    x = randn((m, k), dtype, device, seed=12)
    b = randn((n,), dtype, device, seed=13) if bias else None
    r = randn((m, n), dtype, device, seed=14, scale=2.0)
    nw = randn((n,), dtype, device, seed=15, scale=0.2) + 1
    for config in configs:
        tail = norm_tail.norm_tail(r, nw, 1e-5, quant)
        y = fp8_gemv(x, weight, scale, b, *config, tail=tail)
        plain = fp8_gemv(x, weight, scale, b, *config)
        assert_exact(y, plain)
        normed, added = rmsnorm.add_rms_norm(plain, r, nw, 1e-5)
        assert_exact(tail.new_residual, added)
        one_chunk = n <= 512 * config[2]
        if device == "cpu" and one_chunk:
            assert_exact(tail.out, normed)
        else:
            eps = torch.finfo(y.dtype).eps
            torch.testing.assert_close(tail.out, normed, rtol=2 * eps, atol=0)
        if quant:
            assert_fp8_rows(tail.rows_fp8, tail.scales, fp8_gemm.quantize_rows(tail.out),
                            tail.out)
        assert not split_tickets._counters[x.device].any()


CASES = [dict(m=1, n=64, k=128, quant=True), dict(m=2, n=40, k=96, bias=True),
         dict(m=1, n=600, k=32, quant=True, configs=((64, 32, 1, 1),))]

test_interpreted, _ = case_tests(__name__, check, CASES, variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("m, k, quant", [(1, 4096, False), (1, 4096, True), (3, 4096, True),
                                         (1, 14336, False)])
def test_cuda_8b_shapes(m, k, quant):
    """The 8B's o (4,096 x 4,096) and down (4,096 x 14,336) projections on configs the
    one-row choice takes."""
    check(m, 4096, k, quant=quant, dtype="bfloat16", device="cuda",
          configs=[(4, 2048, 4, 1, 1, True), (8, 1024, 4, 1, 1, True), (4, 1024, 4, 1)])


@cuda
def test_cuda_graph_replays_give_the_eager_bits():
    """Replayed in a CUDA graph on new inputs (its counter back at 0 after each launch)."""
    weight, scale = quantized(4096, 4096, False, "cuda", seed=11)
    x, r = (randn((1, 4096), "bfloat16", "cuda", seed=seed) for seed in (12, 14))
    nw = randn((4096,), "bfloat16", "cuda", seed=15, scale=0.2) + 1

    def fn():
        tail = norm_tail.norm_tail(r, nw, 1e-5, True)
        y = fp8_gemv(x, weight, scale, None, 4, 2048, 4, 1, ahead=True, tail=tail)
        return y, tail.out, tail.new_residual, tail.scales
    assert_graph_replays(fn, [x, r])


def test_rejects_split_k_and_a_tail_of_another_shape():
    x, weight = torch.zeros(1, 64), torch.zeros(8, 64, dtype=FP8)
    tail = norm_tail.norm_tail(torch.zeros(1, 8), torch.ones(8), 1e-5, False)
    with pytest.raises(ValueError, match="one part of K"):
        fp8_gemv(x, weight, torch.ones(8), None, 8, 64, 4, 1, split_k=2, tail=tail)
    for wrong in (norm_tail.norm_tail(torch.zeros(2, 8), torch.ones(8), 1e-5, False),
                  norm_tail.norm_tail(torch.zeros(1, 8), torch.ones(4), 1e-5, False),
                  tail._replace(weight=torch.ones(8, dtype=torch.float16))):
        with pytest.raises(ValueError, match="norm tail"):
            fp8_gemv(x, weight, torch.ones(8), None, 8, 64, 4, 1, tail=wrong)
