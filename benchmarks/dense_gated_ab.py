"""bf16 gate_up with SiLU-and-mul in its epilogue (kernels/dense_gated_tma.py) against the pair
the engine runs at 33-64 rows (the GEMM `dense_gemm.linear` chose, then
`silu_mul.silu_and_mul`), the 8B's gate_up [28672, 4096] (issue 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/dense_gated_ab.py [--rows 40 64] [--rounds 3]
    [--output F]

For each row count: the dispatch's choice (timed as the engine times it), then
`dense_gated_choice.timings_ms` (the decode chain: PDL on, each call after a kernel writing
its input, over copies of the weight past L2) of the pair and of every fused tiling,
--rounds times; µs a call (median, and the rounds' spread), whether each tiling gives the
pair's bits (`dense_gated_choice.candidates`: the dispatch's K step and tokens a tile, one
part of K), and what `steady_choice` takes among those."""
import json

import torch

from benchmarks import fused_rounds
from parashift.kernels import dense_gated_choice, dense_gemm

GATE_UP = (28672, 4096)


def measure(rows: int, rounds: int) -> dict:
    n, k = GATE_UP
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    dense_gated_choice.unfused(x, weight)  # the dispatch's choice
    dispatch = dense_gemm.measured_choice(rows, weight, x.dtype, x.device, False)
    same_bits = dense_gated_choice.candidates(dispatch)
    block_m = getattr(dispatch, "block_m", 64)
    tilings = [dense_gated_choice.Tiling(*t, block_m=block_m)
               for t in dense_gated_choice.TILINGS]
    result = dict(rows=rows, dispatch=dense_gemm.label(dispatch), **fused_rounds.fused_rounds(
        lambda: dense_gated_choice.timings_ms(x, weight, tilings), tilings, same_bits, rounds,
        dense_gated_choice.MARGIN, dense_gated_choice.label))
    print(json.dumps(result), flush=True)
    return result


def main():
    fused_rounds.main(measure, [40, 64])


if __name__ == "__main__":
    main()
