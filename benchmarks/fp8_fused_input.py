"""The FP8 activation quantization fused into the op before (issue 60, layers/fp8_input.py)
against the two kernels it replaces, on the 8B layer's shapes on one GPU.

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_fused_input.py [--rows 1 4 16 64 256 4096]
    [--output F]
Per row count, µs per call replayed from a CUDA graph (kernels/gemm_timing.py, medians of
interleaved rounds; inputs stay in L2, as a step's activations do): the residual-add RMSNorm
of hidden 4096 alone, then `fp8_gemm.quantize_rows` of its output, and `rms_norm_fp8`; SiLU-
and-mul of 2 x 14336 alone, then `quantize_rows`, and `silu_and_mul_fp8` (as the row count
chooses, split over programs, one program a row); `quantize_rows` alone of hidden and
intermediate rows at 4, 8 and 16 warps."""
import argparse
import json

import torch

from parashift.kernels import fp8_gemm, gemm_timing, rmsnorm, silu_mul

HIDDEN, INTERMEDIATE, EPS = 4096, 14336, 1e-5
QUANTIZE_WARPS = (4, 8, 16)


def candidates(rows: int) -> dict:
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, device="cuda", dtype=torch.bfloat16)
    return {
        "norm": lambda i: rmsnorm.add_rms_norm(x, residual, weight, EPS),
        "norm_then_quantize": lambda i: fp8_gemm.quantize_rows(
            rmsnorm.add_rms_norm(x, residual, weight, EPS)[0]),
        "norm_fp8": lambda i: rmsnorm.rms_norm_fp8(x, residual, weight, EPS),
        "silu": lambda i: silu_mul.silu_and_mul(gate_up),
        "silu_then_quantize": lambda i: fp8_gemm.quantize_rows(silu_mul.silu_and_mul(gate_up)),
        "silu_fp8": lambda i: silu_mul.silu_and_mul_fp8(gate_up),
        # each row over several programs (the default below silu_mul.SPLIT_ROWS), or one
        "silu_fp8_split": lambda i: silu_mul.silu_and_mul_fp8(gate_up, split=True),
        "silu_fp8_rows": lambda i: silu_mul.silu_and_mul_fp8(gate_up, split=False),
        # the per-token quantization alone of hidden and intermediate rows, by warps
        **{f"quantize_{name}_w{warps}": lambda i, rows=rows_in, warps=warps:
           fp8_gemm.quantize_rows(rows, num_warps=warps)
           for name, rows_in in (("hidden", x), ("inter", gate_up[:, :INTERMEDIATE]))
           for warps in QUANTIZE_WARPS},
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256, 4096])
    p.add_argument("--output", default=None)
    args = p.parse_args()
    results = []
    for rows in args.rows:
        timings = gemm_timing.replayed_timings_ms(candidates(rows), copies=1)
        results.append({"rows": rows, **{f"{k}_us": round(1e3 * v, 2) for k, v in timings.items()}})
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=results), f, indent=1)


if __name__ == "__main__":
    main()
