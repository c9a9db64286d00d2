"""The 8B's bf16 decode GEMMs at 64-256 rows: cuBLAS against every config of the TMA kernel
(parashift/kernels/dense_gemm_tma.py), timed as decode runs them (gemm_timing's chain: PDL
on, each call after a kernel writing its input, weight copies past L2), each beside its
floor: the larger of its bytes over the copy bandwidth and its FLOPs over the matrix peak.

Usage (GPU): PYTHONPATH=. python3 benchmarks/dense_gemm_sweep.py --rows 64 256 \
    [--workers 15] [--output sweep.json]
The configs compile first in --workers processes (Triton's cache then serves the timing)."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from fp8_gemm_sweep import copy_bandwidth, precompile  # noqa: E402
from prefill_throughput import BF16_MATRIX_RATE  # noqa: E402

from parashift.kernels import dense_gemm, gemm_timing  # noqa: E402
from parashift.kernels.dense_gemm_tma import tma_linear  # noqa: E402

# the 8B's projections (N, K): qkv, o, gate_up, down, and its LM head
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}


def operands(rows: int, n: int, k: int):
    return (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5)


def compile_configs(jobs: list[tuple]) -> list[str]:
    """Runs each (rows, n, k, config) once under PDL; the failures, as text."""
    failed = []
    for rows, n, k, config in jobs:
        x, weight = operands(rows, min(n, 1024), k)
        try:
            tma_linear(x, weight, None, config)
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            failed.append(f"{rows} {config}: {str(exc)[:300]}")
    torch.cuda.synchronize()
    return failed


def sweep(rows: int, n: int, k: int, bandwidth: float) -> dict:
    x, weight = operands(rows, n, k)
    copies = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x, chain=True)
    runs = {"cuBLAS": lambda i: torch.nn.functional.linear(xin, copies[i])}
    for c in dense_gemm.CONFIGS:
        runs[c] = lambda i, c=c: tma_linear(xin, copies[i], None, c)
    timings = gemm_timing.replayed_timings_ms(runs, len(copies), chain)
    bytes_us = 2 * (n * k + rows * (k + n)) / bandwidth * 1e6
    flops_us = 2 * rows * n * k / BF16_MATRIX_RATE * 1e6
    floor_us = max(bytes_us, flops_us)

    def entry(key, ms):
        name = key if isinstance(key, str) else dense_gemm.label(key)
        return dict(config=name, us=round(1e3 * ms, 2), of_floor=round(floor_us / (1e3 * ms), 3))
    ranked = [entry(key, timings[key]) for key in sorted(timings, key=timings.get)]
    return dict(rows=rows, n=n, k=k, bytes_us=round(bytes_us, 2), flops_us=round(flops_us, 2),
                cublas=entry("cuBLAS", timings["cuBLAS"]) if "cuBLAS" in timings else None,
                best=ranked[0], worst_error=worst_error(x, weight), candidates=ranked)


def worst_error(x: torch.Tensor, weight: torch.Tensor) -> dict:
    """Each config's output against cuBLAS's (both bf16): the largest relative norm of the
    difference, and its config (a check on the shapes the tests do not run)."""
    expected = torch.nn.functional.linear(x, weight).double()
    errors = {}
    for c in dense_gemm.CONFIGS:
        try:
            actual = tma_linear(x, weight, None, c).double()
        except Exception:  # noqa: BLE001  a config that does not compile: in "failed"
            continue
        errors[dense_gemm.label(c)] = ((actual - expected).norm() / expected.norm()).item()
    worst = max(errors, key=errors.get, default=None)
    return dict(config=worst, relative=errors.get(worst), checked=len(errors))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[64, 128])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--workers", type=int, default=min(15, os.cpu_count() or 1))
    p.add_argument("--output", default=None)
    args = p.parse_args()
    start = time.perf_counter()
    # one compile a (config, K): rows and N are alike to Triton's specialization
    jobs = list({(c, SHAPES[s][1]): (args.rows[0], *SHAPES[s], c) for s in args.shapes
                 for c in dense_gemm.CONFIGS}.values())
    failed = (precompile(jobs, args.workers, compile_configs) if args.workers > 1
              else compile_configs(jobs))
    print(json.dumps({"compiled_s": round(time.perf_counter() - start, 1), "failed": failed}),
          flush=True)
    bandwidth = copy_bandwidth()
    results = []
    for rows in args.rows:
        for name in args.shapes:
            results.append(dict(proj=name, **sweep(rows, *SHAPES[name], bandwidth)))
            r = results[-1]
            print(json.dumps(dict(proj=name, rows=rows, cublas=r["cublas"], best=r["best"],
                                  worst_error=r["worst_error"], next=r["candidates"][1:4])),
                  flush=True)
            if args.output:  # after each shape: a run cut short keeps what it measured
                summary = dict(device=torch.cuda.get_device_name(),
                               copy_bandwidth_tb_s=bandwidth / 1e12,
                               matrix_rate_tflop_s=BF16_MATRIX_RATE / 1e12, failed=failed,
                               seconds=round(time.perf_counter() - start, 1), results=results)
                with open(args.output, "w") as f:
                    json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
