"""How often the FP8 GEMM's start-up choice flips between timings (issue 60): the 8B's FP8
projections timed as an engine start times them, --repeats times in one process (each a
fresh measurement of every candidate, as a fresh start makes), and from each timing both
the old rule's pick (the fastest, if it beats cuBLASLt by the margin) and
`gemm_timing.steady_choice`'s. A steady rule picks the same config every time.

Usage (GPU): PYTHONPATH=. python3 benchmarks/choice_steadiness.py [--rows 1 64]
    [--projections qkv o gate_up down] [--repeats 4] [--output F]"""
import argparse
import collections
import json
import pathlib

import torch

from benchmarks.fp8_gemm_sweep import PROJECTIONS
from parashift.kernels import fp8_gemm, gemm_timing


def fastest_rule(timings: dict):
    """The rule before session 48: the fastest candidate where it beats the reference by
    the margin."""
    best = min((c for c in timings if c is not None), key=timings.__getitem__, default=None)
    return None if best is None or timings[best] > fp8_gemm.MARGIN * timings[None] else best


def measure(name: str, rows: int, repeats: int) -> dict:
    n, k = PROJECTIONS[name]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = (torch.randn(n, k, device="cuda") * 0.05).to(fp8_gemm.FP8)
    scale = torch.rand(n, 1, device="cuda") * 0.01 + 0.001
    picks = {"fastest": [], "steady": []}
    for _ in range(repeats):
        with gemm_timing.timing_launches():
            timings = fp8_gemm.timings_ms(x, weight, scale, None)
        picks["fastest"].append(fp8_gemm._label(fastest_rule(timings)))
        picks["steady"].append(fp8_gemm._label(gemm_timing.steady_choice(
            timings, fp8_gemm.MARGIN, f"FP8 GEMM, {rows} rows x {(n, k)}", fp8_gemm._label)))
    result = dict(projection=name, rows=rows, **{
        rule: dict(picks=collections.Counter(p).most_common(), flips=sum(
            a != b for a, b in zip(p, p[1:]))) for rule, p in picks.items()})
    print(json.dumps(result), flush=True)
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    p.add_argument("--projections", nargs="+", default=list(PROJECTIONS))
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    fp8_gemm.CONFIGS = ()  # as --no-dot-configs: never chosen (benchmark_log)
    results = [measure(name, rows, args.repeats) for rows in args.rows
               for name in args.projections]
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(
            dict(device=torch.cuda.get_device_name(), results=results), indent=1))


if __name__ == "__main__":
    main()
