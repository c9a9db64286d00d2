"""The FP8 GEMV with the weight streamed by TMA against an fp64 product of the dequantized
weight (test_fp8_gemv.py's check): one small case under the Triton interpreter (3.9 on: 3.6's
fails on tensor descriptors as on tl.dot), configs of benchmarks/fp8_gemm_sweep.py's kinds on
CUDA."""
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
# one to eight warps, 8-128 rows a program, K split by tickets
ON_CUDA = ((16, 256, 4, 6, 1, False), (8, 256, 1, 8, 1, False), (16, 256, 2, 6, 1, False),
           (128, 128, 8, 4, 1, False), (16, 256, 4, 6, 2, True), (8, 256, 2, 8, 4, True))


def check(m, n, k, dtype="float32", device="cpu", configs=SMALL, **case):
    test_fp8_gemv.check(m, n, k, dtype=dtype, device=device, configs=configs,
                        gemv=fp8_gemv_tma, **case)


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", [dict(m=1, n=300, k=4096), dict(m=4, n=96, k=1040, bias=True),
                                  dict(m=2, n=64, k=512, padded=True)], ids=case_id)
def test_cuda(case, dtype):
    """Every config in bf16 (decode's dtype), the first in the others."""
    check(**case, dtype=dtype, device="cuda",
          configs=ON_CUDA if dtype == "bfloat16" else ON_CUDA[:1])


def test_rejects_a_k_step_wider_than_a_tma_box():
    weight = torch.zeros(16, 512, dtype=fp8_gemm.FP8)
    with pytest.raises(ValueError, match="block_k <= 256"):
        fp8_gemv_tma(torch.zeros(1, 512), weight, torch.ones(16), None, 16, 512, 4, 2)
