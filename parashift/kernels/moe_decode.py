"""The experts of a decode batch past the small path (16-row blocks, a few pairs an expert:
Qwen3-30B-A3B at 64 tokens has 512 pairs over 128 experts) through the prefill path's kernels
(kernels/moe_prefill.py): gate and up in one grouped GEMM with SiLU-and-mul in its epilogue,
the down GEMM into an unzeroed buffer, the top-k sum kernel. Four launches after the pair sort
where kernels/fused_moe.grouped_experts' unfused path takes six (two fills, SiLU·mul and
torch's sum beside the two GEMMs); the same roundings (gate and up each to the activations'
dtype, then silu_mul_values; each pair's weighted output; the k pairs summed in fp32 in slot
order where torch's sum adds in its own order).

PARASHIFT_MOE_DECODE_FUSED=0 keeps the unfused path (read at each call: a graph keeps what
its capture read); PARASHIFT_MOE_DECODE_TILES="n,k,warps,stages,n,k,warps,stages" (gate_up's,
whose BLOCK_N counts gate columns, each with as many up columns; then down's) for
benchmarks/moe_chain.py's sweep."""
import os

import triton

from parashift.engine_switches import switch
from parashift.kernels import moe_prefill

ENV, TILES_ENV = "PARASHIFT_MOE_DECODE_FUSED", "PARASHIFT_MOE_DECODE_TILES"
BLOCK_M = 16
# (BLOCK_N, BLOCK_K, warps, stages), gate_up's BLOCK_N gate columns with as many up columns
# (the weight bytes a program of the unfused GEMM's 64-column tile reads), down's the unfused
# GEMM's (fused_moe.gemm_tiles at 16 rows): the fastest of benchmarks/moe_chain.py's at 64
# tokens on an H200 (16 layers in a graph, ~126 experts routed a layer; µs a layer with the
# router: unfused 310.5, these 297.7, the next gate_up 64x128 w4 s4 301.5, the rest 308-314)
GATE_UP_TILE = (32, 128, 2, 4)
DOWN_TILE = (64, 128, 2, 4)


def enabled() -> bool:
    return switch(ENV, "1")


def tiles_for(inter: int, hidden: int) -> dict:
    """moe_prefill's tiles dict at 16-row blocks: PARASHIFT_MOE_DECODE_TILES's, else the
    defaults narrowed to small dims (the tests' shapes)."""
    value = os.environ.get(TILES_ENV)
    if value:
        return _tiles_from(value)

    def fit(tile, n, k):
        return (min(tile[0], max(16, triton.next_power_of_2(n))),
                min(tile[1], max(16, triton.next_power_of_2(k))), *tile[2:])

    return {"block_m": BLOCK_M, "gate_up": fit(GATE_UP_TILE, inter, hidden),
            "down": fit(DOWN_TILE, hidden, inter)}


def _tiles_from(value: str) -> dict:
    parts = value.split(",")
    if len(parts) != 8 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{TILES_ENV} must be eight positive integers "
                         f"\"n,k,warps,stages,n,k,warps,stages\", got {value!r}")
    numbers = tuple(int(p) for p in parts)
    return moe_prefill.check_tiles({"block_m": BLOCK_M, "gate_up": numbers[:4],
                                    "down": numbers[4:]})
