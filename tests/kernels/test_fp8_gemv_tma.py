"""The FP8 GEMV with the weight streamed by TMA against an fp64 product of the dequantized
weight (test_fp8_gemv.py's check): one small case under the Triton interpreter, every
registered config on CUDA."""
import pytest
import torch

from parashift.kernels import fp8_gemm
from parashift.kernels.fp8_gemv_tma import fp8_gemv_tma
from tests.kernels import test_fp8_gemv
from tests.kernels.common import case_id, case_tests, cuda

# (block_n, block_k, warps, stages, split_k, tickets): several row tiles and a partial last
# one (n 40), a partial last K step (k 208), K split in three by tickets (one part past K)
SMALL = ((16, 64, 4, 3, 1, False), (32, 32, 2, 2, 3, True))
# weight rows of 16-byte aligned columns (TMA's rule): k a multiple of 16, padded by 16
CASES = [dict(m=3, n=40, k=208, bias=True, padded=True)]
REGISTERED = [(c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k, c.tickets)
              for c in fp8_gemm.GEMV_TMA_CONFIGS]


def check(m, n, k, dtype="float32", device="cpu", configs=SMALL, **case):
    test_fp8_gemv.check(m, n, k, dtype=dtype, device=device, configs=configs,
                        gemv=fp8_gemv_tma, **case)


test_interpreted, _ = case_tests(__name__, check, CASES)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", [dict(m=1, n=300, k=4096), dict(m=4, n=96, k=1040, bias=True),
                                  dict(m=2, n=64, k=512, padded=True)], ids=case_id)
def test_cuda(case, dtype):
    """Every registered config in bf16 (decode's dtype), the first in the others."""
    check(**case, dtype=dtype, device="cuda",
          configs=REGISTERED if dtype == "bfloat16" else REGISTERED[:1])


def test_rejects_a_k_step_wider_than_a_tma_box():
    weight = torch.zeros(16, 512, dtype=fp8_gemm.FP8)
    with pytest.raises(ValueError, match="block_k <= 256"):
        fp8_gemv_tma(torch.zeros(1, 512), weight, torch.ones(16), None, 16, 512, 4, 2)
