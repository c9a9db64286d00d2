"""The rounds a fused-epilogue benchmark times its pair and tilings in (fp8_gated_ab.py,
dense_gated_ab.py), and their command line: each round's `timings()` (the choice's own timing, under
`gemm_timing.timing_launches`), the medians, each tiling's spread and share of the pair, and
what `steady_choice` takes among the tilings that give the pair's bits."""
import argparse
import json
import pathlib
import statistics
from typing import Callable

import torch

from parashift.kernels import gemm_timing


def fused_rounds(timings: Callable[[], dict], tilings: list, same_bits: list, rounds: int,
                 margin: float, label: Callable[[object], str]) -> dict:
    """{pair_us, tilings: [{tiling, same_bits, us, spread, of_pair}], chosen} over `rounds`
    calls of `timings()` (ms by tiling, the pair under None)."""
    samples: dict = {}
    for _ in range(rounds):
        with gemm_timing.timing_launches():
            for key, ms in timings().items():
                samples.setdefault(key, []).append(ms)
    medians = {key: statistics.median(ms) for key, ms in samples.items()}
    kept = gemm_timing.Timings({key: medians[key] for key in [None, *same_bits]
                                if key in medians})
    chosen = gemm_timing.steady_choice(kept, margin)
    return dict(pair_us=round(1e3 * medians[None], 2),
                tilings=[dict(tiling=label(t), same_bits=t in same_bits,
                              us=round(1e3 * medians[t], 2),
                              spread=round(gemm_timing.relative_spread(samples[t]), 4),
                              of_pair=round(medians[t] / medians[None], 4))
                         for t in tilings if t in medians],
                chosen=label(chosen))


def main(measure: Callable[[int, int], dict], default_rows: list[int]) -> None:
    """The benchmarks' command line: measure(rows, rounds) for each of --rows (each printed
    as measured), all written to --output."""
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=default_rows)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    results = [measure(rows, args.rounds) for rows in args.rows]
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(
            dict(device=torch.cuda.get_device_name(), results=results), indent=1))
