"""The QKV GEMM's split-K parts summed in the RoPE + KV-write kernel after it, timed as the
choice times it (kernels/split_parts_rotary_choice.py: the decode chain, PDL on, weight
copies past L2), at the 8B's QKV [6144, 4096] (32 q heads, 8 KV heads of 128), FP8 and bf16
weights, per row count (issue 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/split_parts_rotary.py [--rows 64]
    [--weights bf16 fp8] [--no-dot-configs] [--output F]
Prints and writes µs per (GEMM, rotary) pair for the reference (the layer's own GEMM as its
choice picks it, then the plain rotary kernel) and each parts-out candidate, their spreads,
the choice's pick and the layer GEMM's chosen configs."""
import argparse
import json

import torch

from benchmarks.split_parts_norm import weight_of
from parashift.kernels import dense_gemm, fp8_gemm, gemm_timing, split_parts_rotary_choice

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, MAX_POSITION = 4096, 32, 8, 128, 4096


def measure(rows: int, weights: str) -> dict:
    chooser = split_parts_rotary_choice
    shape = ((Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
    weight, scale = weight_of(shape, weights == "fp8")
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    cos_sin = torch.randn(MAX_POSITION, HEAD_DIM, device="cuda")
    with gemm_timing.timing_launches():
        timings = chooser.timings_ms(x, weight, scale, Q_HEADS, HEAD_DIM, cos_sin)
    pick = gemm_timing.steady_choice(timings, chooser.MARGIN)
    result = dict(pair="qkv", weights=weights, rows=rows, weight=list(shape),
                  us={chooser.label(k): round(1e3 * v, 3) for k, v in timings.items()},
                  spread={chooser.label(k): round(v, 4) for k, v in timings.spread.items()},
                  choice=chooser.label(pick))
    print(json.dumps(result), flush=True)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[64])
    parser.add_argument("--weights", nargs="+", default=["bf16", "fp8"],
                        choices=["fp8", "bf16"])
    parser.add_argument("--no-dot-configs", action="store_true")
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.no_dot_configs:
        fp8_gemm.CONFIGS = ()
    results = [measure(rows, weights) for weights in args.weights for rows in args.rows]
    summary = dict(device=torch.cuda.get_device_name(), results=results,
                   fp8_gemm=fp8_gemm.chosen(), dense_gemm=dense_gemm.chosen())
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
