"""The skinny GEMM against an fp64 product: under the Triton interpreter on the CPU
(float32, float16) and compiled on CUDA; and which of it or cuBLAS a shape gets."""
import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import skinny_gemm
from parashift.kernels.skinny_gemm import Config, GemvConfig, skinny_linear
from parashift.layers.linear import ColumnParallelLinear
from tests.kernels.common import assert_graph_replays, case_tests, cuda, randn

# and the GEMV (fp8_gemv's kernel on 16-bit weights): a K step past K, K split over programs,
# the next weight tile's load ahead, K's parts summed by tickets
SMALL = (Config(16, 64, 4, 1), Config(32, 128, 4, 2), GemvConfig(4, 64, 2), GemvConfig(8, 32, 1, 2),
         GemvConfig(4, 32, 1, 3, ahead=True, tickets=True))
# k not a multiple of block_k, n not a multiple of block_n; padded: the weight's rows
# are a column slice of a wider buffer (stride(0) > k), as a shift-plan slice can be
CASES = [
    dict(m=1, n=64, k=128),
    dict(m=3, n=100, k=200),
    dict(m=4, n=48, k=96, bias=True),
    dict(m=2, n=40, k=130, padded=True),
    dict(m=1, n=16, k=64, bias=True, padded=True),
]


def check(m, n, k, bias=False, padded=False, dtype="float32", device="cpu", configs=SMALL):
    x = randn((m, k), dtype, device, seed=1)
    wide = randn((n, k + 8 if padded else k), dtype, device, seed=2, scale=k ** -0.5)
    weight = wide[:, :k]
    b = randn((n,), dtype, device, seed=3) if bias else None
    ref = F.linear(x.double(), weight.double(), b.double() if bias else None)
    # fp32 sums of k terms drift by ~sqrt(k) ulps; a 16-bit output hides that in its
    # single rounding, so it lands within an ulp or two of the exact product
    eps = torch.finfo(getattr(torch, dtype)).eps
    tol = 2 * eps * (k ** 0.5 if dtype == "float32" else 1)
    for config in configs:
        out = skinny_linear(x, weight, b, config)
        assert out.shape == (m, n) and out.dtype == x.dtype
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=2 * tol)


def check_on_cuda(**case):
    check(**case, configs=skinny_gemm.CONFIGS + skinny_gemm.GEMV_CONFIGS)


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)
_, test_cuda = case_tests(__name__, check_on_cuda, CASES)


def test_rejects_more_rows_than_it_serves():
    x, w = torch.zeros(skinny_gemm.MAX_ROWS + 1, 16), torch.zeros(16, 16)
    with pytest.raises(ValueError, match="at most 4 rows"):
        skinny_linear(x, w, None, SMALL[0])


def test_layers_use_it_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(skinny_gemm, "linear", lambda *a: calls.append(a) or F.linear(*a))
    layer = ColumnParallelLinear(16, 32, bias=False)
    layer(torch.zeros(2, 16))
    assert not calls
    if torch.cuda.is_available():
        layer.cuda()(torch.zeros(2, 16, device="cuda"))
        assert len(calls) == 1


@cuda
def test_dispatch_measures_outside_capture_and_replays_in_a_graph():
    x = randn((1, 4096), "bfloat16", "cuda")
    w = randn((6144, 4096), "bfloat16", "cuda", scale=4096 ** -0.5)
    skinny_gemm._choices.clear()
    eager = skinny_gemm.linear(x, w, None)
    assert len(skinny_gemm._choices) == 1
    torch.testing.assert_close(eager, F.linear(x, w), rtol=2 ** -7, atol=2 ** -7)
    assert_graph_replays(lambda: skinny_gemm.linear(x, w, None), [x])
