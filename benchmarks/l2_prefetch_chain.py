"""The next GEMMs' weights pulled into L2 while the small kernels run (layers/l2_prefetch.py,
issue 61): the 8B shape's decode layers (benchmarks/pdl_chain.py's, each with weights and a
KV pool of its own, so nothing stays in L2 from layer to layer), PDL on, one CUDA graph a
variant, the graphs replayed in turn (interleaved repeats), median µs a layer.

Usage (GPU): PYTHONPATH=. python3 benchmarks/l2_prefetch_chain.py [--weights fp8 bf16]
    [--batch-sizes 1] [--layers 32] [--repeats 21] [--no-dot-configs] [--output F]
    [--variants off PARASHIFT_L2_PREFETCH=1,PARASHIFT_L2_PREFETCH_MB=qkv:32/o:8 ...]
A variant is `off` (PARASHIFT_L2_PREFETCH=0) or NAME=VALUE[,NAME=VALUE]: environment settings
read while its graph is captured (the budgets: PARASHIFT_L2_PREFETCH_MB). FP8 layers as the
engine runs them (the norms and SiLU-and-mul quantize the next GEMM's rows). Each row says
whether every variant's output has the first's bits. (The placements in the PDL chain, the
`lines` and `read` kinds, the prefetches before the wait and other chunk sizes and program
counts measured slower and were removed in session 51.)"""
import argparse
import contextlib

import torch

from benchmarks import pdl_chain
from benchmarks.decode_throughput import parse_settings
from parashift.kernels import fp8_gemm, skinny_gemm
from parashift.layers import l2_prefetch as placement

ORDER = ("qkv", "o", "gate_up", "down")
FULL = "PARASHIFT_L2_PREFETCH_MB=qkv:32/o:8/gate_up:8/down:8"  # o, gate_up, down, next qkv
DEFAULT_VARIANTS = [
    "off",
    "PARASHIFT_L2_PREFETCH=1",  # the budget's default o:8: the best measured
    "PARASHIFT_L2_PREFETCH_MB=qkv:16",
    FULL,
    "PARASHIFT_PDL_PREFETCH_KB=32",  # each GEMM program's own prefetch before its wait
]


def variant(text: str) -> str:
    if text != "off" and not all(name.startswith("PARASHIFT_") for name in parse_settings(text)):
        raise argparse.ArgumentTypeError(f"{text!r}: off or PARASHIFT_NAME=VALUE[,...]")
    return text


def settings_of(text: str) -> dict:
    """A variant's environment settings."""
    return {placement.ENV: "0"} if text == "off" else parse_settings(text)


class Prefetcher:
    """Launches the planned prefetch after each of the step's GEMMs (pdl_chain.linear
    wrapped while a graph is captured), by the engine's step state (StepPrefetches)."""

    def __init__(self, layers: list[pdl_chain.Layer]):
        weights = [self.matrix(layer.weights[name]) for layer in layers for name in ORDER]
        self.index = {id(w): i for i, w in enumerate(weights)}
        self.steps = placement.StepPrefetches([*ORDER] * len(layers), lambda: weights)

    @staticmethod
    def matrix(weight) -> torch.Tensor:
        return weight[0] if isinstance(weight, tuple) else weight

    @contextlib.contextmanager
    def wrapping(self):
        text = placement.budget_text()
        if not placement.enabled():
            yield
            return
        plain = pdl_chain.linear

        def linear(x, weight, x_fp8=None):
            y = plain(x, weight, x_fp8)
            self.steps.launch(self.index[id(self.matrix(weight))], text)
            return y

        pdl_chain.linear = linear
        try:
            yield
        finally:
            pdl_chain.linear = plain


def measure(weights: str, batch: int, count: int, repeats: int, bandwidth: float,
            variants: list[str], context: int = 1024) -> dict:
    fp8 = weights == "fp8"
    args = pdl_chain.step_args(count, fp8, batch, context, context + 1024)
    layers = args[2]
    prefetcher = Prefetcher(layers)

    def run(name: str) -> torch.Tensor:
        with prefetcher.wrapping():
            return pdl_chain.step(*args, fp8_input=fp8)[0].clone()
    graphs, outputs = pdl_chain.variant_graphs(variants, settings_of, run)
    results = pdl_chain.replayed_fractions(graphs, layers, fp8, batch, context, count,
                                           bandwidth, repeats)[0]
    first = variants[0]
    pdl_chain.ratios_to_first(results, first)
    same = {name: torch.equal(outputs[first], out) for name, out in outputs.items()}
    del graphs, layers
    torch.cuda.empty_cache()
    return dict(weights=weights, batch=batch, layers=count, variants=results, same_bits=same,
                chosen=fp8_gemm.chosen() if fp8 else skinny_gemm.chosen())


def main():
    p = pdl_chain.variant_parser(batch_sizes=[1], repeats=21, weights=["fp8"])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, type=variant,
                   help="the first is the others' reference")
    args = p.parse_args()
    pdl_chain.run_rows(args, lambda weights, batch, bandwidth: measure(
        weights, batch, args.layers, args.repeats, bandwidth, args.variants))


if __name__ == "__main__":
    main()
