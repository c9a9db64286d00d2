"""The stream-K FP8 x FP8 GEMM (fp8_gemm_streamk.py) against a dequantized reference, its work
cut among one program, a few, and one an iteration: every tile's ticket counter back at 0
after each launch, and the same bits on a second launch."""
import pytest
import torch

from parashift.kernels import fp8_gemm, fp8_gemm_streamk, split_tickets
from parashift.kernels.fp8_gemm import Config
from tests.kernels.common import case_tests, cuda
from tests.kernels.test_fp8_gemm import operands

SMALL = (64, 32, 4, 2)  # block_n, block_k, warps, stages
# three column tiles of three K steps, the last partial (k 80); over 4 programs each tile is
# held by two of them, over one an iteration (0: one an SM, at most one an iteration) by three
CASES = [dict(m=17, n=144, k=80, bias=True)]
PROGRAMS = (1, 4, 0)


def check(m, n, k, bias=False, dtype="float32", device="cpu", shape=SMALL):
    x, w, scale, b, expected = operands(m, n, k, bias, dtype, device)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    for programs in PROGRAMS:
        actual = fp8_gemm_streamk.streamk_linear(xq, x_scale, w, scale, b, x.dtype, *shape,
                                                 programs=programs)
        assert actual.shape == (m, n) and actual.dtype == x.dtype
        relative = (actual.double() - expected).norm() / expected.norm()
        assert relative < 8e-2, (programs, relative)  # E4M3 activations: 3 mantissa bits
        assert not split_tickets._counters[x.device].any()
        again = fp8_gemm_streamk.streamk_linear(xq, x_scale, w, scale, b, x.dtype, *shape,
                                                programs=programs)
        assert torch.equal(again, actual), programs


test_interpreted, test_cuda = case_tests(__name__, check, CASES, uses_dot=True)


@cuda
@pytest.mark.parametrize("shape", [(64, 256, 4, 5), (128, 128, 4, 6), (256, 128, 8, 4)])
def test_engine_tiles_match_dequantized_through_the_choice_path(shape):
    """The sweep's tiles at 64 rows of a 4,096-wide K, through fp8_weight_linear's dispatch."""
    x, w, scale, _, expected = operands(64, 1040, 4096, False, "bfloat16", "cuda")
    actual = fp8_gemm.fp8_weight_linear(x, w, scale, None,
                                        Config(fp8_gemm_streamk.KERNEL, *shape))
    assert (actual.double() - expected).norm() / expected.norm() < 8e-2
    assert not split_tickets._counters[x.device].any()

