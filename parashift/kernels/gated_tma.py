"""What the TMA gate_up kernels with SiLU-and-mul in their epilogue share (fp8_gated_tma.py,
dense_gated_tma.py): the tiling's fields and the main loop, where each program multiplies
the tokens' tile by BLOCK_N gate rows and the same BLOCK_N up rows (HALF further)."""
from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class GatedTiling:
    block_n: int  # gate rows a program (and as many up rows)
    block_k: int
    num_warps: int
    num_stages: int


@triton.jit
def gate_and_up(x_desc, w_desc, first_m, first_n, HALF, K, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """The fp32 sums [BLOCK_N, BLOCK_M] of the gate rows from first_n and of their up rows
    (HALF further) with the tokens from first_m, along K a BLOCK_K step at a time (one tile
    of tokens loaded a step for both), NUM_STAGES deep."""
    gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=NUM_STAGES):
        x = tl.trans(x_desc.load([first_m, step * BLOCK_K]))
        gate = tl.dot(w_desc.load([first_n, step * BLOCK_K]), x, gate)
        up = tl.dot(w_desc.load([HALF + first_n, step * BLOCK_K]), x, up)
    return gate, up
