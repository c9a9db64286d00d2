"""GEMV configs beyond kernels/skinny_gemm.py's GEMV_CONFIGS on a model's small projections
at decode rows (Qwen3-30B-A3B's qkv [5120, 2048], o [2048, 4096] and its router [128, 2048]),
against cuBLAS and the configs already measured: µs per call timed as decode runs them
(kernels/gemm_timing.py, PDL suspended) and as the engine's choice times them (L2 flushed,
skinny_gemm.timings_ms's way), beside the weight-streaming floor at --bandwidth TB/s.

Usage (GPU): python3 benchmarks/gemv_sweep.py --rows 1 [--output gemv_sweep.json]"""
import argparse
import functools
import json

import torch
import torch.nn.functional as F
import triton.testing

from parashift.kernels import gemm_timing, pdl
from parashift.kernels.skinny_gemm import GEMV_CONFIGS, GemvConfig, label, skinny_linear

SHAPES = {"qkv": (5120, 2048), "o": (2048, 4096), "router": (128, 2048)}
CANDIDATES = (GemvConfig(1, 2048, 4), GemvConfig(2, 1024, 2), GemvConfig(4, 512, 4),
              GemvConfig(8, 512, 4), GemvConfig(16, 256, 4), GemvConfig(4, 2048, 8),
              GemvConfig(2, 1024, 4, ahead=True), GemvConfig(4, 512, 4, ahead=True),
              GemvConfig(8, 512, 4, ahead=True), GemvConfig(1, 2048, 4, ahead=True))
# of GEMV_CONFIGS, timed beside the candidates (--all: every one)
KNOWN = (GemvConfig(4, 1024, 4), GemvConfig(4, 1024, 4, ahead=True))


def measure(name: str, n: int, k: int, rows: int, bandwidth: float, every_known: bool) -> dict:
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    copies = gemm_timing.weight_copies(weight)
    xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in copies]
    configs = [c for c in (GEMV_CONFIGS if every_known else KNOWN) + CANDIDATES if c.block_n <= n]
    runs = {"cuBLAS": lambda i: F.linear(xs[i], copies[i])}
    runs.update({f"{label(c)} w{c.num_warps}{'' if c in GEMV_CONFIGS else ' (new)'}":
                 (lambda i, c=c: skinny_linear(xs[i], copies[i], None, c)) for c in configs})
    bench = functools.partial(triton.testing.do_bench, warmup=5, rep=30, return_mode="median")
    with pdl.suspended():
        replayed = gemm_timing.replayed_timings_ms(runs, len(copies))
        flushed = {key: bench(lambda fn=fn: fn(0)) for key, fn in runs.items() if key in replayed}
    floor_us = n * k * 2 / bandwidth * 1e6
    us = {key: (round(replayed[key] * 1e3, 2), round(flushed[key] * 1e3, 2)) for key in replayed}
    best = min(us, key=lambda key: us[key][0])
    return {"shape": name, "rows": rows, "weight": [n, k], "floor_us": round(floor_us, 2),
            "best": best, "best_us": us[best][0], "cublas_us": us["cuBLAS"][0],
            "us_replayed_flushed": us}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--bandwidth", type=float, default=4.25, help="TB/s of the floor")
    p.add_argument("--all", action="store_true", help="every config of GEMV_CONFIGS too")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    rows = []
    for name in args.shapes:
        for m in args.rows:
            rows.append(measure(name, *SHAPES[name], m, args.bandwidth * 1e12, args.all))
            print(json.dumps(rows[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
