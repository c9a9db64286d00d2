"""The GEMM choice timed as decode runs it, and SiLU-and-mul inside the gate_up projection's
GEMV, on the 8B shape's decode kernels on one GPU (issues 60, 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/decode_chain.py [--weights fp8 bf16]
    [--batch-sizes 1] [--layers 32] [--repeats 15] [--no-dot-configs] [--variants ...]
    [--output F]
For each weight dtype and batch, variants of a step's 32 layers (benchmarks/pdl_chain.py's
kernels, PDL as the engine launches, CUDA graphs), the GEMM choices made anew where the
timing changes: "graph" (PARASHIFT_GEMM_TIMING=graph, main's: candidates timed with PDL
suspended), "chain" (=chain: PDL on, each call after a kernel writing its input), and with
SiLU·mul formed in the gate_up GEMV's epilogue ("*_silu_gate_up") where that measured faster
(kernels/gated_gemv.py). The graphs are
replayed in turn (interleaved repeats), median µs per layer; each variant's choices; max
|difference| of the outputs against the first variant's. --no-dot-configs leaves the FP8
tl.dot configs (never chosen at 1-4 rows on an H200, session 43) out of the FP8 choice, to
save their compile time."""
import os
import time

import torch

from benchmarks import pdl_chain
from parashift.kernels import fp8_gemm, gated_gemv, gemm_timing, silu_mul, skinny_gemm

VARIANTS = {"graph": ("graph", False), "chain": ("chain", False),
            "chain_silu_gate_up": ("chain", True), "graph_silu_gate_up": ("graph", True)}
DEFAULT_VARIANTS = ["graph", "chain", "chain_silu_gate_up"]


def fused_mlp(h: torch.Tensor, layer: pdl_chain.Layer) -> torch.Tensor:
    """pdl_chain.mlp with SiLU·mul in the gate_up GEMV where gated_gemv chose it."""
    gate_up, down = layer.weights["gate_up"], layer.weights["down"]
    weight, scale = gate_up if isinstance(gate_up, tuple) else (gate_up, None)
    config = gated_gemv.choice(h, weight, scale, None)
    activated = (gated_gemv.fused_linear(h, weight, scale, None, config)
                 if config is not None else
                 silu_mul.silu_and_mul(pdl_chain.linear(h, gate_up)))
    return pdl_chain.linear(activated, down)


def choices() -> dict:
    return dict(fp8=fp8_gemm.chosen(), bf16=skinny_gemm.chosen(), gated=gated_gemv.chosen())


def measure(weights: str, batch: int, count: int, repeats: int, bandwidth: float,
            variants: list[str]) -> dict:
    fp8 = weights == "fp8"
    context = 1024
    args = pdl_chain.step_args(count, fp8, batch, context, context + 1024)
    layers = args[2]
    graphs, outputs, chosen, setup_s = {}, {}, {}, {}
    last_timing = None
    for name in variants:
        timing, fused = VARIANTS[name]
        if timing != last_timing:  # variants timed alike share the unfused GEMMs' choices
            fp8_gemm._choices.clear()
            skinny_gemm._choices.clear()
        gated_gemv._choices.clear()
        last_timing = timing
        os.environ[gemm_timing.TIMING_ENV] = timing
        started = time.perf_counter()
        graphs[name] = pdl_chain.capture(lambda: outputs.__setitem__(name, pdl_chain.step(
            *args, fused_mlp if fused else pdl_chain.mlp)[0].clone()))
        setup_s[name] = round(time.perf_counter() - started, 1)
        chosen[name] = choices()
    first = variants[0]
    results = pdl_chain.replayed_fractions(graphs, layers, fp8, batch, context, count,
                                           bandwidth, repeats)[0]
    diffs = pdl_chain.largest_differences(outputs, first)
    del graphs, layers
    torch.cuda.empty_cache()
    return dict(weights=weights, batch=batch, layers=count, variants=results,
                **{f"speedup_{name}_vs_{first}": round(results[first]["us_per_layer"]
                                                       / results[name]["us_per_layer"], 4)
                   for name in variants[1:]},
                **{f"max_abs_diff_vs_{first}": diffs}, setup_s=setup_s, chosen=chosen)


def main():
    p = pdl_chain.variant_parser(batch_sizes=[1], repeats=15, weights=["fp8", "bf16"])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS),
                   help="the first is the others' reference")
    args = p.parse_args()
    pdl_chain.run_rows(args, lambda weights, batch, bandwidth: measure(
        weights, batch, args.layers, args.repeats, bandwidth, args.variants))


if __name__ == "__main__":
    main()
