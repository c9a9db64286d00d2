"""The FP8 GEMV (one to four rows) against an fp64 product of the dequantized weight: under
the Triton interpreter on the CPU (float32, float16) and compiled on CUDA."""
import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import fp8_gemm, gated_gemv, silu_mul, skinny_gemm, split_tickets
from parashift.kernels import fp8_gemv as fp8_gemv_module
from parashift.kernels.fp8_gemv import MAX_ROWS, fp8_gemv
from tests.kernels.common import assert_exact, case_id, case_tests, cuda, randn

FP8 = torch.float8_e4m3fn
# (block_n, block_k, warps, stages, split_k, ahead, tickets): small tiles, so that the cases
# cover several programs, a partial last K step, and K split over programs (its parts added
# atomically, or by the last program to take a ticket); the next tile's load ahead over all
# of K and over parts of it (four configs: the interpreter's time is CI's; test_cuda takes
# every measured config by family)
SMALL = ((16, 64, 4, 1, 1, False, False), (8, 32, 2, 1, 3, False, False),
         (16, 64, 4, 1, 1, True, False), (8, 32, 2, 1, 3, True, True))
# n not a multiple of block_n, k not of block_k; padded: the weight's rows are a column
# slice of a wider buffer (stride(0) > k), as a shift-plan slice can be
CASES = [
    dict(m=1, n=64, k=128),
    dict(m=2, n=40, k=130, padded=True),
    dict(m=3, n=100, k=200, bias=True),
    dict(m=4, n=48, k=96, bias=True),
    dict(m=4, n=17, k=1000, padded=True, strided_x=True),
    dict(m=1, n=16, k=64, bias=True, padded=True),
]


def quantized(n, k, padded, device, seed=2):
    """(E4M3 weight [n, k], fp32 scale [n, 1]); padded: rows of a [n, k + 16] buffer."""
    wide = randn((n, k + 16 if padded else k), "float32", device, seed=seed, scale=k ** -0.5)
    scale = wide.abs().amax(1, keepdim=True) / torch.finfo(FP8).max
    return (wide / scale).to(FP8)[:, :k], scale


def check(m, n, k, bias=False, padded=False, strided_x=False, dtype="float32", device="cpu",
          configs=SMALL):
    weight, scale = quantized(n, k, padded, device)
    x = randn((m, k), dtype, device, seed=1, strided=strided_x)
    b = randn((n,), dtype, device, seed=3) if bias else None
    ref = F.linear(x.double(), weight.double() * scale.double(), b.double() if bias else None)
    eps = torch.finfo(getattr(torch, dtype)).eps
    tol = 2 * eps * (k ** 0.5 if dtype == "float32" else 1)
    for config in configs:
        out = fp8_gemv(x, weight, scale, b, *config)
        assert out.shape == (m, n) and out.dtype == x.dtype
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=2 * tol)
        if config[-1]:  # tickets: the same bits again, every counter back at 0
            assert torch.equal(fp8_gemv(x, weight, scale, b, *config), out)
            assert not split_tickets._counters[x.device].any()


# the measured configs by family, so that a GPU call can test the newest alone
FAMILIES = {"plain": lambda c: not (c.ahead or c.tickets), "ahead": lambda c: c.ahead,
            "tickets": lambda c: c.tickets}


test_interpreted, _ = case_tests(__name__, check, CASES, variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda(family, case, dtype):
    check(**case, dtype=dtype, device="cuda", configs=[
        (c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k, c.ahead, c.tickets)
        for c in fp8_gemm.GEMV_CONFIGS if FAMILIES[family](c)])


@pytest.mark.parametrize("rows", [0, MAX_ROWS + 1])
def test_rejects_rows_it_does_not_serve(rows):
    weight = torch.zeros(16, 32, dtype=FP8)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        fp8_gemv(torch.zeros(rows, 32), weight, torch.ones(16), None, *SMALL[0])


def test_rejects_a_weight_strided_along_k():
    weight = torch.zeros(32, 16, dtype=FP8).t()
    with pytest.raises(ValueError, match="contiguous along K"):
        fp8_gemv(torch.zeros(1, 32), weight, torch.ones(16), None, *SMALL[0])


def check_silu_out(m, n, k, bias=False, fp8=True, dtype="float32", device="cpu",
                   configs=((8, 64, 4, 1), (4, 32, 2, 1, 1, True))):
    """The GEMV of a [gate; up] weight storing silu(gate) * up gives the bits of the plain
    GEMV followed by SiLU-and-mul's kernel (n gate rows not a multiple of the tile's)."""
    weight, scale = quantized(2 * n, k, False, device, seed=5)
    if not fp8:
        weight, scale = (weight.float() * scale).to(getattr(torch, dtype)), torch.ones(
            2 * n, device=device)
    x = randn((m, k), dtype, device, seed=6, scale=4.0)
    b = randn((2 * n,), dtype, device, seed=3) if bias else None
    for config in configs:
        assert_exact(fp8_gemv(x, weight, scale, b, *config, silu_out=True),
                     silu_mul.silu_and_mul(fp8_gemv(x, weight, scale, b, *config)))


SILU_OUT_CASES = [dict(m=3, n=20, k=100, bias=True)]


test_silu_out_interpreted, _ = case_tests(__name__, check_silu_out, SILU_OUT_CASES)


@cuda
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16-weights"])
def test_silu_out_cuda(fp8, m):
    configs = fp8_gemm.GEMV_CONFIGS if fp8 else skinny_gemm.GEMV_CONFIGS
    check_silu_out(m, 2048, 1536, bias=m == 3, fp8=fp8, dtype="bfloat16", device="cuda",
                   configs=one_of_each_family([c for c in configs if c.split_k == 1]))


def one_of_each_family(configs) -> list[tuple]:
    """fp8_gemv's arguments of the first config of each kind (plain, ahead, tickets, both)."""
    firsts = {}
    for c in configs:
        firsts.setdefault((c.ahead, c.tickets), gated_gemv.args(c))
    return list(firsts.values())


def test_silu_out_rejects_split_k_and_odd_tiles():
    for block_n, split_k in ((8, 2), (3, 1)):
        with pytest.raises(ValueError, match="silu_out"):
            fp8_gemv(torch.zeros(1, 64), torch.zeros(8, 64, dtype=FP8), torch.ones(8), None,
                     block_n, 64, 4, 1, split_k, silu_out=True)


def test_the_evict_first_switch_reads_0_or_1(monkeypatch):
    monkeypatch.delenv(fp8_gemv_module.EVICT_ENV, raising=False)
    assert fp8_gemv_module.evict_first()  # the default
    monkeypatch.setenv(fp8_gemv_module.EVICT_ENV, "0")
    assert not fp8_gemv_module.evict_first()
    monkeypatch.setenv(fp8_gemv_module.EVICT_ENV, "yes")
    with pytest.raises(ValueError, match=fp8_gemv_module.EVICT_ENV):
        fp8_gemv_module.evict_first()


@cuda
@pytest.mark.parametrize("config", [(8, 1024, 4, 1), (4, 1024, 4, 1, 2, True, True)])
def test_weight_loads_marked_evict_first_give_the_same_bits(monkeypatch, config):
    weight, scale = quantized(300, 4096, False, "cuda")
    x = randn((1, 4096), "bfloat16", "cuda", seed=1)
    monkeypatch.setenv(fp8_gemv_module.EVICT_ENV, "0")
    plain = fp8_gemv(x, weight, scale, None, *config)
    monkeypatch.setenv(fp8_gemv_module.EVICT_ENV, "1")
    assert torch.equal(fp8_gemv(x, weight, scale, None, *config), plain)
