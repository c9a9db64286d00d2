"""FP8 gate_up with SiLU-and-mul in its epilogue (kernels/fp8_gated_tma.py, then the product's
rows quantized for down) against the pair the engine runs at 16-64 rows (the GEMM
`fp8_gemm.linear` chose, then `silu_mul.silu_and_mul_fp8`), the 8B's gate_up [28672, 4096], x
in E4M3 as the norm before hands it over (issue 60).

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_gated_ab.py [--rows 16 32 64] [--rounds 3]
    [--output F]

For each row count: the dispatch's choice (timed as the engine times it, tl.dot configs left
out as --no-dot-configs leaves them), then `fp8_gated_choice.timings_ms` (the decode chain:
PDL on, each call after a kernel writing its E4M3 rows, over copies of the weight past L2)
of the pair and of every fused tiling (down's rows quantized by `fp8_gemm.quantize_rows` or
from the tiles' largest magnitudes, "by parts"), --rounds times; µs a call (median, and the rounds'
spread), whether each tiling gives the pair's bits (`fp8_gated_choice.candidates`: the same
K step as the dispatch's config, one part of K), and what `steady_choice` takes among those."""
import json

import torch

from benchmarks.fp8_gemm_sweep import PROJECTIONS
from benchmarks import fused_rounds
from parashift.kernels import fp8_gated_choice, fp8_gemm


def measure(rows: int, rounds: int) -> dict:
    n, k = PROJECTIONS["gate_up"]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = (torch.randn(n, k, device="cuda") * 0.05).to(fp8_gemm.FP8)
    scale = torch.rand(n, 1, device="cuda") * 0.01 + 0.001
    x_fp8 = fp8_gemm.quantize_rows(x)
    fp8_gemm.linear(x, weight, scale, None, x_fp8)  # the dispatch's choice
    dispatch = fp8_gemm.measured_choice(rows, weight, x.dtype, x.device, False)
    same_bits = fp8_gated_choice.candidates(dispatch)
    max_block_m = getattr(dispatch, "max_block_m", 0)
    tilings = [fp8_gated_choice.Tiling(*t, max_block_m=max_block_m, by_parts=by_parts)
               for by_parts in (False, True) for t in fp8_gated_choice.TILINGS]
    result = dict(rows=rows, dispatch=fp8_gemm.chosen()[-1]["kernel"], **fused_rounds.fused_rounds(
        lambda: fp8_gated_choice.timings_ms(x, x_fp8, weight, scale, tilings), tilings,
        same_bits, rounds, fp8_gated_choice.MARGIN, fp8_gated_choice.label))
    print(json.dumps(result), flush=True)
    return result


def main():
    fp8_gemm.CONFIGS = ()  # never chosen above 4 rows since the TMA kernel
    fused_rounds.main(measure, [16, 32, 64])


if __name__ == "__main__":
    main()
