"""FP8 prefill GEMMs with and without cuBLASLt's fast accumulation, against the exact product
of the same FP8 operands (fp64 on the GPU): the relative error each adds beside the error of
quantizing to E4M3 at all (the bf16 product against the FP8 one's exact value). Random
normal activations and weights, the 8B shape's projections at 4,096 rows (issue 60).
Usage (GPU): python3 benchmarks/fp8_fast_accum_error.py [--rows 4096] [--output FILE]"""
import argparse
import json

import torch

from parashift.kernels.fp8_gemm import quantize_rows

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def measure(rows: int, n: int, k: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    exact = (xq.double() * xs.double()) @ (wq.double() * ws.double()).T
    out = {fast: torch._scaled_mm(xq, wq.T, scale_a=xs.float(), scale_b=ws.float().T,
                                  out_dtype=torch.bfloat16, use_fast_accum=fast)
           for fast in (False, True)}
    return dict(rows=rows, n=n, k=k, promoted_vs_exact=relative(out[False], exact),
                fast_vs_exact=relative(out[True], exact),
                bf16_vs_fp8_exact=relative(x @ w.T, exact))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    rows = []
    for name, (n, k) in SHAPES.items():
        rows.append(dict(proj=name, **measure(args.rows, n, k)))
        print(json.dumps(rows[-1]), flush=True)
    if args.output:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(args.output, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
