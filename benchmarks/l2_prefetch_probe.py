"""What an L2 prefetch (kernels/l2_prefetch.py) buys one GEMM at one row, and what it costs:
the 8B shape's FP8 (or bf16) o and gate_up weights; each case a CUDA graph (no host gaps),
L2 flushed first (a 256 MB buffer read), replayed --repeats times, median µs, less the
graph's part before what is measured:
- `cold`: the GEMM after the flush; `hot`: the GEMM replayed alone (its weight left in L2 by
  the replay before, where it fits);
- `prefetch_<kind>_<MB>`: the prefetch kernel of the weight's first MB alone (does it last
  until its bytes land?); `warm_<kind>_<MB>`: the GEMM after that prefetch and a ~30 µs
  spin (the bytes landed); `then_gemm_<kind>_<MB>`: the prefetch then the GEMM at once
  (PDL on: the chain's order, less the small kernels between).

Usage (GPU): PYTHONPATH=. python3 benchmarks/l2_prefetch_probe.py [--weights fp8 bf16]
    [--megabytes 16 32] [--kinds bulk lines read] [--repeats 15] [--output F]"""
import argparse
import json
import statistics

import torch

from benchmarks import pdl_chain
from parashift.kernels import l2_prefetch
from parashift.quantization.fp8 import quantize_rows

SPIN_CYCLES = 60_000  # ~30 µs at the H200's ~1.98 GHz


def graph_us(steps, repeats: int) -> float:
    """Median µs of a CUDA graph of the steps (callables, in order)."""
    graph = pdl_chain.capture(lambda: [step() for step in steps])
    return statistics.median(pdl_chain.replay_ms(graph) for _ in range(repeats)) * 1e3


def probe(weights: str, megabytes: list[int], kinds: list[str], repeats: int) -> dict:
    fp8 = weights == "fp8"
    flush_buffer = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    x = torch.randn(1, pdl_chain.HIDDEN, device="cuda", dtype=torch.bfloat16)

    def flush():  # read, so no dirty line is written back while the GEMM runs
        flush_buffer.max()

    def spin():
        torch.cuda._sleep(SPIN_CYCLES)
    rows = {}
    for name in ("o", "gate_up"):
        w = torch.randn(pdl_chain.SHAPES[name], device="cuda", dtype=torch.bfloat16) * 0.02
        weight = quantize_rows(w) if fp8 else w
        matrix = weight[0] if fp8 else weight
        size = matrix.numel() * matrix.element_size()

        def gemm():
            pdl_chain.linear(x, weight)
        flushed = graph_us([flush], repeats)
        row = dict(weight_mb=round(size / 2 ** 20, 1), flush=round(flushed, 2),
                   cold=round(graph_us([flush, gemm], repeats) - flushed, 2),
                   hot=round(graph_us([gemm], repeats), 2))
        for kind in kinds:
            for mb in megabytes:
                span = [l2_prefetch.Span(matrix, 0, min(mb << 20, size) // 16 * 16)]

                def prefetch():
                    l2_prefetch.prefetch(span, kind)
                landed = graph_us([flush, prefetch, spin], repeats)
                row[f"prefetch_{kind}_{mb}"] = round(graph_us([flush, prefetch], repeats)
                                                     - flushed, 2)
                row[f"warm_{kind}_{mb}"] = round(graph_us([flush, prefetch, spin, gemm],
                                                          repeats) - landed, 2)
                row[f"then_gemm_{kind}_{mb}"] = round(graph_us([flush, prefetch, gemm],
                                                               repeats) - flushed, 2)
        rows[name] = row
        print(json.dumps({weights: {name: row}}), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", nargs="+", default=["fp8"], choices=["fp8", "bf16"])
    p.add_argument("--megabytes", type=int, nargs="+", default=[16, 32])
    p.add_argument("--kinds", nargs="+", default=list(l2_prefetch.KINDS),
                   choices=list(l2_prefetch.KINDS))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    spin_us = graph_us([lambda: torch.cuda._sleep(SPIN_CYCLES)], args.repeats)
    result = dict(device=torch.cuda.get_device_name(),
                  l2_mb=torch.cuda.get_device_properties(0).L2_cache_size / 2 ** 20,
                  spin_us=round(spin_us, 2),
                  **{w: probe(w, args.megabytes, args.kinds, args.repeats)
                     for w in args.weights})
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
