"""The 16-bit TMA GEMM of decode at 33-64 rows (y^T = W x^T, both operands by tensor
descriptors) against the float64 product: one small split config under the Triton
interpreter (one case, both dtypes), every registered config on CUDA, and the dispatch's
choice."""
import os
from unittest import mock

import pytest
import torch

from parashift.kernels import dense_gemm, dense_gemm_tma, pdl, split_tickets
from parashift.kernels.dense_gemm_tma import Config
from tests.kernels.common import case_tests, cuda, randn

# row tiles of 16 tokens and column tiles of 64 over a 40 x 80 output (partial tiles both
# ways), K split in 3 by tickets with a part past K's end (k 80: two steps of 32 and a half)
SMALL = (Config(64, 16, 32, 4, 2, 3),)
CASES = [dict(m=40, n=80, k=80, bias=True)]


def operands(m, n, k, bias, dtype, device):
    """(x, weight, bias or None, their product in float64)."""
    x = randn((m, k), dtype, device, seed=1)
    w = randn((n, k), dtype, device, seed=2, scale=k ** -0.5)
    b = randn((n,), dtype, device, seed=3) if bias else None
    expected = torch.nn.functional.linear(x.double(), w.double(),
                                          None if b is None else b.double())
    return x, w, b, expected


def check(m, n, k, bias=False, dtype="float32", device="cpu", configs=SMALL):
    x, w, b, expected = operands(m, n, k, bias, dtype, device)
    for config in configs:
        actual = dense_gemm_tma.tma_linear(x, w, b, config)
        assert actual.shape == (m, n) and actual.dtype == x.dtype
        relative = (actual.double() - expected).norm() / expected.norm()
        assert relative < (1e-2 if x.element_size() == 2 else 1e-4), config
        if config.split_k > 1:  # the same bits again: the parts in split order, counters at 0
            assert torch.equal(dense_gemm_tma.tma_linear(x, w, b, config), actual)
            assert not split_tickets._counters[x.device].any()


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("case", [dict(m=64, n=208, k=1024), dict(m=128, n=4096, k=512)])
def test_registered_configs_match_float64(case):
    check(**case, dtype="bfloat16", device="cuda", configs=dense_gemm.CONFIGS)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_odd_rows_with_a_bias_match_float64(dtype):
    """37 rows (a partial row tile), a bias, a K of 320 (a partial last step), split and not."""
    check(m=37, n=96, k=320, bias=True, dtype=dtype, device="cuda",
          configs=dense_gemm.CONFIGS[:2] + dense_gemm.CONFIGS[-1:])


@cuda
def test_the_bias_loaded_before_the_pdl_wait_keeps_the_bits():
    """The bias loaded before the PDL wait moves no arithmetic."""
    x, w, b, _ = operands(64, 4096, 1024, True, "bfloat16", "cuda")
    config = dense_gemm.CONFIGS[1]  # split 2 by tickets
    with mock.patch.dict(os.environ, {pdl.ENV: "0"}):
        plain = dense_gemm_tma.tma_linear(x, w, b, config)
    with mock.patch.dict(os.environ, {pdl.ENV: "1"}):
        early = dense_gemm_tma.tma_linear(x, w, b, config)
    assert torch.equal(plain, early)


@cuda
def test_linear_chooses_per_row_bucket_and_matches_cublas():
    """`linear` times its candidates once per row bucket (33-64 rows: one), keeps the choice,
    and computes F.linear's product (another summation order: close, not equal); with
    PARASHIFT_DENSE_TMA=0 it is F.linear's bits."""
    w = randn((1536, 1024), "bfloat16", "cuda", seed=2, scale=1024 ** -0.5)
    dense_gemm._choices.clear()
    for rows in (40, 48, 64):
        x = randn((rows, 1024), "bfloat16", "cuda", seed=rows)
        assert dense_gemm.handles(x)
        torch.testing.assert_close(dense_gemm.linear(x, w, None),
                                   torch.nn.functional.linear(x, w), rtol=2e-2, atol=2e-2)
        with mock.patch.dict(os.environ, {dense_gemm.ENV: "0"}):
            assert torch.equal(dense_gemm.linear(x, w, None), torch.nn.functional.linear(x, w))
    assert [c["rows"] for c in dense_gemm.chosen()] == [64]
    assert not dense_gemm.handles(randn((4, 1024), "bfloat16", "cuda"))
    assert not dense_gemm.handles(randn((65, 1024), "bfloat16", "cuda"))
    assert not dense_gemm.handles(randn((64, 1024), "float32", "cuda"))
