"""FP8 GEMM tile configs swept per decode shape (8B, one GPU) beyond the ones
`kernels.fp8_gemm` measures: for each (rows, weight shape) the fastest of the current
candidates and of a wider set, in GB/s of weight read, timed as `linear` times them
(CUDA graphs over weight copies past L2). Issue 60: which configs to add.
    python3 benchmarks/fp8_config_sweep.py --rows 1 2 4 64 --output sweep.json"""
import argparse
import itertools
import json

import torch

from parashift.kernels import fp8_gemm, gemm_timing
from parashift.kernels.fp8_gemm import Config

SHAPES_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
             "down": (4096, 14336)}


def wider(rows: int) -> list[Config]:
    if rows <= 4:
        return [Config("gemv", bn, bk, warps, stages, split) for bn, bk, warps, stages, split
                in itertools.product((2, 4, 8), (1024, 2048, 4096), (4, 8), (1, 2), (1, 2))
                if bk >= 8 * 32 * warps and bn * bk <= 16384]
    tiles = [(bn, bk, stages) for bn in (32, 64, 128) for bk, stages in
             ((128, 3), (128, 4), (128, 5), (256, 3), (256, 4), (512, 2))]
    return [Config(kernel, bn, bk, 4, stages, split) for kernel in ("w8", "w8a8")
            for bn, bk, stages in tiles for split in (1, 2)]


def sweep(rows: int, n: int, k: int) -> dict:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = (torch.randn(n, k, device="cuda") * 0.05).to(fp8_gemm.FP8)
    scale = torch.rand(n, device="cuda") * 0.01 + 0.001
    copies = gemm_timing.weight_copies(weight)
    current = set(fp8_gemm.candidates(rows, n))
    configs = current | set(wider(rows))
    runs = {None: lambda i: fp8_gemm.scaled_mm_linear(x, copies[i], scale, None)}
    runs.update({c: lambda i, c=c: fp8_gemm.fp8_weight_linear(x, copies[i], scale, None, c)
                 for c in configs if c.block_n <= 2 * n})
    timings = gemm_timing.replayed_timings_ms(runs, len(copies))
    gbs = lambda ms: round(n * k / ms / 1e6, 1)
    best_current = min((c for c in timings if c is None or c in current), key=timings.get)
    best = sorted(timings, key=timings.get)[:5]
    return dict(rows=rows, n=n, k=k, cublas_us=round(1e3 * timings[None], 2),
                current=[str(best_current), round(1e3 * timings[best_current], 2),
                         gbs(timings[best_current])],
                best=[[str(c), round(1e3 * timings[c], 2), gbs(timings[c])] for c in best])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    p.add_argument("--output", default=None)
    args = p.parse_args()
    results = []
    for rows in args.rows:
        for name, (n, k) in SHAPES_8B.items():
            results.append(dict(name=name, **sweep(rows, n, k)))
            print(json.dumps(results[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
