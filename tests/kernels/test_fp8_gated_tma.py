"""gate_up with SiLU-and-mul in its epilogue (kernels/fp8_gated_tma.py) and the fused pair of
kernels/fp8_gated_choice.py: the bits of the TMA GEMM of the same K step then SiLU-and-mul
(with FP8 rows), and near the float64 product; under the Triton interpreter on small shapes,
on CUDA at every registered tiling and the 8B's gate_up at 16-64 rows."""
import re

import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import fp8_gated_choice, fp8_gated_tma, fp8_gemm, fp8_gemm_tma, silu_mul
from parashift.kernels.fp8_gated_choice import Tiling
from tests.deterministic.test_kernels import compile_sm90
from tests.kernels.common import assert_exact, case_tests, cuda
from tests.kernels.test_fp8_gemm import operands

# gate tiles past HALF (80 of 32), a partial last K step (80 of 32), token tiles of 16 (max
# block 16: several at 33 rows); down's rows quantized from the tiles' largest magnitudes
# (`check` compares quantize_rows' of the product too)
SMALL = (Tiling(32, 32, 4, 2, max_block_m=16, by_parts=True),)
CASES = [dict(m=33, half=80, k=80)]


def unfused(xq, x_scale, w, scale, dtype, tiling: Tiling, block_n: int):
    """The dispatch's TMA GEMM on `block_n` weight rows a tile, the tiling's K step and
    tokens a tile, then SiLU-and-mul with FP8 rows."""
    y = fp8_gemm_tma.tma_linear(xq, x_scale, w, scale, None, dtype, block_n, tiling.block_k,
                                tiling.num_warps, tiling.num_stages, 1, True,
                                max_block_m=tiling.max_block_m)
    return silu_mul.silu_and_mul_fp8(y)


def check(m, half, k, dtype="float32", device="cpu", configs=SMALL, same_tiles=True):
    x, w, scale, _, wide = operands(m, 2 * half, k, False, dtype, device)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    gate, up = wide.to(x.dtype).double().split(half, dim=1)
    expected = F.silu(gate) * up
    for tiling in configs:
        out, q, q_scale = fp8_gated_choice.fused((xq, x_scale), w, scale, x.dtype, tiling)
        assert out.shape == (m, half) and out.dtype == x.dtype
        relative = (out.double() - expected).norm() / expected.norm()
        assert relative < 8e-2, (tiling, relative)  # FP8 activations: 3 mantissa bits
        # the same tile shapes (the interpreter's sums follow them), and on CUDA the
        # dispatch's own [gate | up] tiles of twice the rows
        for block_n in (tiling.block_n,) * same_tiles + (2 * tiling.block_n,) * (
                device == "cuda"):
            ref_out, ref_q, ref_scale = unfused(xq, x_scale, w, scale, x.dtype, tiling, block_n)
            assert_exact(out, ref_out)
            assert_exact(q.view(torch.uint8), ref_q.view(torch.uint8))
            assert_exact(q_scale, ref_scale)
        rows_q, rows_scale = fp8_gemm.quantize_rows(out)
        assert_exact(rows_q.view(torch.uint8), q.view(torch.uint8))
        assert_exact(rows_scale, q_scale)


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)


def tilings(block_k: int | None = None, by_parts: bool = False) -> list[Tiling]:
    return [Tiling(*t, by_parts=by_parts) for t in fp8_gated_choice.TILINGS
            if block_k in (None, t[1])]


@cuda
def test_every_tiling_gives_the_dispatch_bits():
    check(m=64, half=448, k=1024, dtype="bfloat16", device="cuda",
          configs=tilings() + tilings(by_parts=True)[:2])


@cuda
@pytest.mark.parametrize("m", [1, 5, 17, 31, 33, 63])
def test_any_rows_give_the_dispatch_bits(m):
    """Odd row counts over token tiles of 16, 32 and 64 (one tiling of each K step: each
    tiling a compile of each kernel a tile width)."""
    check(m=m, half=448, k=1024, dtype="bfloat16", device="cuda",
          configs=tilings(128)[:1] + tilings(256, by_parts=True)[:1], same_tiles=False)


@cuda
@pytest.mark.parametrize("m", [16, 37, 64])
def test_the_8b_gate_up(m):
    check(m=m, half=14336, k=4096, dtype="bfloat16", device="cuda",
          configs=tilings(128)[:1] + tilings(128, by_parts=True)[:1], same_tiles=False)


def test_candidates_only_where_the_dispatch_sums_k_alike():
    tma = fp8_gemm.Config("tma_w8a8", 256, 128, 8, 4, 1, tickets=True, max_block_m=32)
    assert fp8_gated_choice.candidates(tma) == [
        Tiling(*t, max_block_m=32, by_parts=by_parts) for by_parts in (False, True)
        for t in fp8_gated_choice.TILINGS if t[1] == 128]
    assert fp8_gated_choice.candidates(fp8_gemm.Config("tma_w8a8", 64, 256, 4, 4, 2,
                                                       tickets=True)) == []
    assert fp8_gated_choice.candidates(fp8_gemm.Config("w8a8", 64, 256, 4, 3)) == []
    assert fp8_gated_choice.candidates(None) == []


def test_rejects_what_it_cannot_take():
    w = torch.zeros(6, 32, dtype=fp8_gemm.FP8)
    with pytest.raises(ValueError, match="even rows"):
        fp8_gated_tma.gated_linear(torch.zeros(2, 32, dtype=fp8_gemm.FP8), torch.ones(2, 1),
                                   w[:5], torch.ones(5), torch.float32, 32, 32, 4, 2)
    with pytest.raises(ValueError, match="E4M3 rows"):
        fp8_gated_tma.gated_linear(torch.zeros(2, 32), torch.ones(2, 1), w, torch.ones(6),
                                   torch.float32, 32, 32, 4, 2)


def wgmma_lines(kernel, block_n: int, tiling: Tiling, constexprs: dict) -> list[str]:
    """The kernel's wgmma instructions in its sm_90 PTX (compiled on the CPU), registers
    blanked: `block_n` weight rows a tile, 64 tokens."""
    types = {"x_desc": f"tensordesc<fp8e4nv[64, {tiling.block_k}]>",
             "w_desc": f"tensordesc<fp8e4nv[{block_n}, {tiling.block_k}]>"}
    pointers = {"xs_ptr": "fp32", "s_ptr": "fp32", "w_ptr": "fp8e4nv", "y_ptr": "bf16",
                "counter_ptr": "i32"}
    ptx = compile_sm90(kernel, dict(BLOCK_M=64, BLOCK_K=tiling.block_k, BLOCK_N=block_n,
                                    NUM_STAGES=tiling.num_stages, USE_PDL=0, PREFETCH_K=0,
                                    **constexprs), pointers, types=types,
                       num_warps=tiling.num_warps, num_stages=tiling.num_stages)["ptx"]
    return [re.sub(r"%[a-z]+\d+", "%r", line.strip()) for line in ptx.splitlines()
            if "wgmma.mma_async" in line]


@pytest.mark.parametrize("tiling", [Tiling(*t) for t in (fp8_gated_choice.TILINGS[0],
                                                           fp8_gated_choice.TILINGS[3])],
                         ids=fp8_gated_choice.label)
def test_the_fused_kernel_chains_the_dispatch_kernels_wgmma(tiling):
    """What the bits rest on, checked on sm_90's PTX without a GPU: both kernels sum each
    output along K by the same E4M3 wgmma instruction (64 weight rows x the tokens x 32 of K),
    as many a K step a 64-row block (gate and up blocks of the fused tile, the dispatch's
    [gate | up] tile of twice the rows)."""
    fused = wgmma_lines(fp8_gated_tma._gated_tma_kernel, tiling.block_n, tiling,
                        dict(LIBDEVICE=True, PART_MAX=True))
    unfused = wgmma_lines(fp8_gemm_tma._fp8_tma_kernel, 2 * tiling.block_n, tiling, dict(
        HAS_BIAS=False, FP8_X=True, SPLIT_K=1, TICKETS=True, BIT_WIDEN=False,
        EARLY_SCALES=True))
    assert fused and set(fused) == set(unfused) and len(fused) == len(unfused)
    assert all(".m64n64k32.f32.e4m3.e4m3 " in line for line in fused)


def test_every_tiling_gives_each_warpgroup_64_gate_rows():
    """The wgmma tile (`test_the_fused_kernel_chains_the_dispatch_kernels_wgmma`); fewer rows
    a warpgroup compile to mma.sync."""
    assert all(t.block_n == 64 * t.num_warps // 4 for t in tilings())
