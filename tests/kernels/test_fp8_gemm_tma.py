"""The TMA FP8-weight GEMM (y^T = W x^T, the weight by tensor descriptors) against a
dequantized reference: one small tile config under the Triton interpreter, every registered
config on CUDA."""
import pytest
import torch

from parashift.kernels import fp8_gemm, fp8_gemm_tma, split_tickets
from parashift.kernels.fp8_gemm import Config
from tests.kernels.common import case_tests, cuda
from tests.kernels.test_fp8_gemm import operands

# split 3 by tickets over 32-column steps: several output tiles of rows and columns, a part
# of K past its end (k 64) and a partial last step (k 80)
SMALL = tuple(Config(kernel, 64, 32, 4, 2, 3, tickets=True) for kernel in fp8_gemm_tma.KERNELS)
CASES = [dict(m=3, n=80, k=80, bias=True), dict(m=33, n=64, k=64)]


def check(m, n, k, bias=False, dtype="float32", device="cpu", configs=SMALL):
    x, w, scale, b, expected = operands(m, n, k, bias, dtype, device)
    for config in configs:
        actual = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
        assert actual.shape == (m, n) and actual.dtype == x.dtype
        relative = (actual.double() - expected).norm() / expected.norm()
        # FP8 activations round each to 3 mantissa bits; widened weights: 16-bit products
        assert relative < (8e-2 if config.kernel == "tma_w8a8" else 1e-2), config
        if config.tickets and config.split_k > 1:  # the same bits again, counters back at 0
            assert torch.equal(fp8_gemm.fp8_weight_linear(x, w, scale, b, config), actual)
            assert not split_tickets._counters[x.device].any()


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True)


@cuda
@pytest.mark.parametrize("case", [dict(m=64, n=208, k=1024), dict(m=17, n=96, k=320, bias=True),
                                  dict(m=5, n=4096, k=512)])
def test_registered_configs_match_dequantized(case):
    check(**case, dtype="bfloat16", device="cuda", configs=fp8_gemm.TMA_CONFIGS)


def test_misaligned_operands_are_told_apart_and_a_misaligned_weight_refused():
    w, w_odd = torch.zeros(32, 48, dtype=fp8_gemm.FP8), torch.zeros(32, 40, dtype=fp8_gemm.FP8)
    assert fp8_gemm_tma.takes(w) and not fp8_gemm_tma.takes(w_odd)  # rows 40 bytes apart
    assert not fp8_gemm_tma.fits(torch.ones(4, 49)[:, 1:])  # a base 4 bytes past alignment
    x = torch.ones(4, 40)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fp8_gemm_tma.tma_linear(x, None, w_odd, torch.ones(32), None, x.dtype, 32, 32, 4, 1,
                                1, False)


def test_measured_only_where_enabled(monkeypatch):
    monkeypatch.setenv(fp8_gemm_tma.ENV, "0")
    assert not set(fp8_gemm.TMA_CONFIGS) & set(fp8_gemm.candidates(64, 4096))
    monkeypatch.setenv(fp8_gemm_tma.ENV, "1")
    assert set(fp8_gemm.TMA_CONFIGS) <= set(fp8_gemm.candidates(64, 4096))
    assert not set(fp8_gemm.TMA_CONFIGS) & set(fp8_gemm.candidates(4, 4096))
    monkeypatch.setenv(fp8_gemm_tma.ENV, "yes")
    with pytest.raises(ValueError, match=fp8_gemm_tma.ENV):
        fp8_gemm.candidates(64, 4096)
