"""The split-K parts summed in the norm after the GEMM, timed as the choice times it
(kernels/split_parts_choice.py: the decode chain, PDL on, weight copies past L2), at the 8B's
o_proj [4096, 4096] (the post-attention norm after it, quantizing for FP8's gate_up) and
down [4096, 14336] (the next layer's input norm after it, quantizing for FP8's QKV), FP8 and
bf16 weights, per row count (issues 60/61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/split_parts_norm.py [--rows 64]
    [--weights fp8 bf16] [--no-dot-configs] [--output F]
Prints and writes µs per (GEMM, norm) pair for the reference (the layer's own GEMM as its
choice picks it, then the plain norm) and each parts-out candidate, their spreads, the
choice's pick and the layer GEMM's chosen configs. --no-dot-configs: fp8_gemm.py's tl.dot
configs left out of the FP8 GEMM's own choice (as decode_throughput.py's flag)."""
import argparse
import json

import torch

from parashift.kernels import dense_gemm, fp8_gemm, gemm_timing, split_parts_choice

HIDDEN, INTERMEDIATE, EPS = 4096, 14336, 1e-5
# (name, weight [N, K], whether the norm after quantizes for an FP8 consumer)
PAIRS = (("o", (HIDDEN, HIDDEN), True), ("down", (HIDDEN, INTERMEDIATE), True))


def weight_of(shape, fp8: bool):
    gen = torch.Generator(device="cuda").manual_seed(0)
    wide = torch.randn(shape, device="cuda", generator=gen) * shape[1] ** -0.5
    if not fp8:
        return wide.to(torch.bfloat16), None
    scale = wide.abs().amax(1, keepdim=True) / fp8_gemm.FP8_MAX
    return (wide / scale).to(fp8_gemm.FP8), scale


def measure(rows: int, weights: str) -> list[dict]:
    results = []
    for name, shape, quantizes in PAIRS:
        weight, scale = weight_of(shape, weights == "fp8")
        x = torch.randn(rows, shape[1], device="cuda", dtype=torch.bfloat16)
        norm_weight = 1 + 0.1 * torch.randn(shape[0], device="cuda", dtype=torch.bfloat16)
        quant = quantizes and weights == "fp8"
        with gemm_timing.timing_launches():
            timings = split_parts_choice.timings_ms(x, weight, scale, norm_weight, EPS, quant)
        pick = gemm_timing.steady_choice(timings, split_parts_choice.MARGIN)
        result = dict(pair=name, weights=weights, rows=rows, weight=list(shape), quant=quant,
                      us={split_parts_choice.label(k): round(1e3 * v, 3)
                          for k, v in timings.items()},
                      spread={split_parts_choice.label(k): round(v, 4)
                              for k, v in timings.spread.items()},
                      choice=split_parts_choice.label(pick))
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[64])
    parser.add_argument("--weights", nargs="+", default=["fp8", "bf16"],
                        choices=["fp8", "bf16"])
    parser.add_argument("--no-dot-configs", action="store_true")
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.no_dot_configs:
        fp8_gemm.CONFIGS = ()
    results = [r for weights in args.weights for rows in args.rows
               for r in measure(rows, weights)]
    summary = dict(device=torch.cuda.get_device_name(), results=results,
                   fp8_gemm=fp8_gemm.chosen(), dense_gemm=dense_gemm.chosen())
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
