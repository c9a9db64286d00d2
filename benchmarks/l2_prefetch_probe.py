"""What an L2 prefetch (kernels/l2_prefetch.py) buys one GEMM at one row, and what it costs:
the 8B shape's FP8 (or bf16) o and gate_up weights, L2 flushed first (a 256 MB buffer
read), then timed between CUDA events (median of --repeats):
- `cold`: the GEMM alone; `warm_<kind>_<MB>`: a prefetch of the weight's first MB, a ~30 µs
  spin (the prefetch lands), then the GEMM (timed from after the spin);
- `prefetch_<kind>_<MB>`: the prefetch kernel alone, launch to completion (does a program
  exit before its prefetches land?), against `prefetch_one_line` (one program, one line); `prefetch_then_gemm_<kind>_<MB>`: the prefetch and then
  the GEMM at once, no spin (PDL on: as in the chain, less the small kernels between).

Usage (GPU): PYTHONPATH=. python3 benchmarks/l2_prefetch_probe.py [--weights fp8 bf16]
    [--megabytes 8 16 32] [--repeats 15] [--output F]"""
import argparse
import json
import statistics

import torch

from benchmarks import pdl_chain
from parashift.kernels import l2_prefetch
from parashift.quantization.fp8 import quantize_rows

SPIN_CYCLES = 60_000  # ~30 µs at the H200's ~1.98 GHz


def timed(before, measured, repeats: int) -> float:
    """Median µs of measured() between events, before() run first each time."""
    times = []
    for _ in range(repeats):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        measured()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return round(statistics.median(times), 2)


def probe(weights: str, megabytes: list[int], repeats: int) -> dict:
    fp8 = weights == "fp8"
    flush_buffer = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    x = torch.randn(1, pdl_chain.HIDDEN, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for name in ("o", "gate_up"):
        w = torch.randn(pdl_chain.SHAPES[name], device="cuda", dtype=torch.bfloat16) * 0.02
        weight = quantize_rows(w) if fp8 else w
        matrix = weight[0] if fp8 else weight
        size = matrix.numel() * matrix.element_size()

        def flush():  # read, so no dirty line is written back while the GEMM runs
            flush_buffer.max()

        def gemm():
            pdl_chain.linear(x, weight)
        gemm()
        row = dict(weight_mb=round(size / 2 ** 20, 1), cold=timed(flush, gemm, repeats),
                   prefetch_one_line=timed(flush, lambda: l2_prefetch.prefetch(
                       [l2_prefetch.Span(matrix, 0, 128)]), repeats))
        for kind in ("bulk", "lines"):
            for mb in megabytes:
                count = min(mb << 20, size) // 16 * 16
                span = [l2_prefetch.Span(matrix, 0, count)]

                def prefetch():
                    l2_prefetch.prefetch(span, kind == "bulk")

                def prefetched_and_landed():
                    flush()
                    prefetch()
                    torch.cuda._sleep(SPIN_CYCLES)
                row[f"warm_{kind}_{mb}"] = timed(prefetched_and_landed, gemm, repeats)
                row[f"prefetch_{kind}_{mb}"] = timed(flush, prefetch, repeats)
                row[f"prefetch_then_gemm_{kind}_{mb}"] = timed(
                    flush, lambda: (prefetch(), gemm()), repeats)
        rows[name] = row
        print(json.dumps({weights: {name: row}}), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", nargs="+", default=["fp8"], choices=["fp8", "bf16"])
    p.add_argument("--megabytes", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    result = dict(device=torch.cuda.get_device_name(),
                  l2_mb=torch.cuda.get_device_properties(0).L2_cache_size / 2 ** 20,
                  **{w: probe(w, args.megabytes, args.repeats) for w in args.weights})
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
