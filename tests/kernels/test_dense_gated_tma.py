"""16-bit gate_up with SiLU-and-mul in its epilogue (kernels/dense_gated_tma.py, chosen by
kernels/dense_gated_choice.py): the bits of the dense TMA GEMM of the same K step and tokens
a tile then SiLU-and-mul, and near the float64 product; under the Triton interpreter on one
small shape, on CUDA at every registered tiling against every dispatch config it may stand
for, and the 8B's gate_up at 33-64 rows."""
import re

import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import dense_gated_choice, dense_gated_tma, dense_gemm, dense_gemm_tma, \
    silu_mul
from parashift.kernels.dense_gated_choice import Tiling
from parashift.kernels.dense_gemm_tma import Config
from tests.deterministic.test_kernels import compile_sm90
from tests.kernels.common import case_tests, cuda, randn

# token tiles of 16 (a partial one at 20 rows), a partial last K step (80 of 32), gate tiles
# of 32 over 96 gate rows (the interpreter's sums follow the tiles' offsets: the up rows
# start on a tile here; CUDA checks a partial gate tile)
SMALL = (Tiling(32, 32, 4, 2, block_m=16),)
CASES = [dict(m=20, half=96, k=80)]


def dispatch_configs(tiling: Tiling, device: str) -> list[Config]:
    """The dense GEMM configs whose bits the tiling must give: on CUDA each registered one of
    its K step and tokens a tile without a K split (the choice may have taken any), on the
    CPU the interpreter's one of its own tile shapes."""
    if device != "cuda":
        return [Config(tiling.block_n, tiling.block_m, tiling.block_k, tiling.num_warps,
                       tiling.num_stages)]
    return [c for c in dense_gemm.CONFIGS if c.split_k == 1 and c.block_k == tiling.block_k
            and c.block_m == tiling.block_m]


def check(m, half, k, dtype="float32", device="cpu", configs=SMALL):
    x = randn((m, k), dtype, device, seed=1)
    w = randn((2 * half, k), dtype, device, seed=2, scale=k ** -0.5)
    gate, up = F.linear(x.double(), w.double()).split(half, dim=1)
    expected = F.silu(gate) * up
    for tiling in configs:
        out = dense_gated_choice.fused(x, w, tiling)
        assert out.shape == (m, half) and out.dtype == x.dtype
        relative = (out.double() - expected).norm() / expected.norm()
        assert relative < (1e-2 if x.element_size() == 2 else 1e-4), (tiling, relative)
        references = dispatch_configs(tiling, device)
        assert references, tiling
        for config in references:
            reference = silu_mul.silu_and_mul(dense_gemm_tma.tma_linear(x, w, None, config))
            assert torch.equal(out, reference), (tiling, config)


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)


def tilings(block_k: int | None = None) -> list[Tiling]:
    return [Tiling(*t) for t in dense_gated_choice.TILINGS if block_k in (None, t[1])]


@cuda
def test_every_tiling_gives_the_dispatch_bits():
    """A partial gate tile at 128 gate rows a program (448 = 3.5 x 128)."""
    check(m=64, half=448, k=1024, dtype="bfloat16", device="cuda", configs=tilings())


@cuda
def test_odd_rows_in_fp16_give_the_dispatch_bits():
    """37 rows (a partial token tile), a partial last K step (320 of 128)."""
    check(m=37, half=448, k=320, dtype="float16", device="cuda", configs=tilings(128)[:1])


@cuda
@pytest.mark.parametrize("m", [33, 64])
def test_the_8b_gate_up(m):
    """Its K step's tilings at 64 rows (compiled by the test before), one at 33."""
    check(m=m, half=14336, k=4096, dtype="bfloat16", device="cuda",
          configs=tilings(128)[:1 if m < 64 else None])


def test_candidates_only_where_the_dispatch_sums_k_alike():
    assert dense_gated_choice.candidates(Config(128, 64, 128, 8, 4)) == tilings(128)
    assert dense_gated_choice.candidates(Config(128, 64, 64, 4, 8)) == tilings(64)
    assert dense_gated_choice.candidates(Config(64, 64, 128, 4, 6, 2)) == []  # K split
    assert dense_gated_choice.candidates(None) == []  # cuBLAS
    assert all(dense_gated_choice.candidates(c) for c in dense_gemm.CONFIGS if c.split_k == 1)


def test_rejects_what_it_cannot_take():
    w = torch.zeros(6, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="even rows"):
        dense_gated_tma.gated_linear(torch.zeros(2, 32, dtype=torch.float16), w[:5], 32, 16,
                                     32, 4, 2)
    with pytest.raises(ValueError, match="in x's dtype"):
        dense_gated_tma.gated_linear(torch.zeros(2, 32), w, 32, 16, 32, 4, 2)


def wgmma_lines(kernel, block_n: int, tiling: Tiling, constexprs: dict) -> list[str]:
    """The kernel's wgmma instructions in its sm_90 PTX (compiled on the CPU), registers
    blanked: `block_n` weight rows a tile, 64 tokens, bf16."""
    types = {"x_desc": f"tensordesc<bf16[64, {tiling.block_k}]>",
             "w_desc": f"tensordesc<bf16[{block_n}, {tiling.block_k}]>"}
    pointers = {"y_ptr": "bf16", "b_ptr": "bf16", "counter_ptr": "i32"}
    ptx = compile_sm90(kernel, dict(BLOCK_M=64, BLOCK_K=tiling.block_k, BLOCK_N=block_n,
                                    NUM_STAGES=tiling.num_stages, USE_PDL=0, **constexprs),
                       pointers, types=types, num_warps=tiling.num_warps,
                       num_stages=tiling.num_stages)["ptx"]
    return [re.sub(r"%[a-z]+\d+", "%r", line.strip()) for line in ptx.splitlines()
            if "wgmma.mma_async" in line]


def test_the_fused_kernel_chains_the_dispatch_kernels_wgmma():
    """What the bits rest on, checked on sm_90's PTX without a GPU: both kernels sum each
    output along K by the same bf16 wgmma instruction (64 weight rows x 64 tokens x 16 of
    K), as many a K step a 64-row block (gate and up blocks of the fused tile, the
    dispatch's tile of twice the rows)."""
    tiling = tilings(128)[0]
    fused = wgmma_lines(dense_gated_tma._dense_gated_kernel, tiling.block_n, tiling,
                        dict(LIBDEVICE=True))
    unfused = wgmma_lines(dense_gemm_tma._dense_tma_kernel, 2 * tiling.block_n, tiling,
                          dict(HAS_BIAS=False, SPLIT_K=1, TICKETS=False))
    assert fused and set(fused) == set(unfused) and len(fused) == len(unfused)
    assert all(".m64n64k16.f32.bf16.bf16 " in line for line in fused)


def test_every_tiling_gives_each_warpgroup_64_gate_rows():
    """The wgmma tile (`test_the_fused_kernel_chains_the_dispatch_kernels_wgmma`); fewer rows
    a warpgroup compile to mma.sync."""
    assert all(t.block_n == 64 * t.num_warps // 4 for t in tilings())
