"""The 8B shape's FP8 decode layers as the engine runs them (issue 60): the norms and
SiLU-and-mul hand their GEMMs the rows quantized per token (layers/fp8_input.py), PDL as
launched, CUDA graphs; one graph under each setting of the launch-time switches, the graphs
replayed in turn (interleaved repeats), median µs a layer against the first variant's.

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_chain_variants.py [--batch-sizes 64]
    [--layers 32] [--repeats 21] [--variants default PARASHIFT_FP8_TMA_PREFETCH_KB=64 ...]
    [--no-dot-configs] [--output F]
A variant is `default` (the environment as it is) or NAME=VALUE[,NAME=VALUE] set while its
graph is captured (a graph keeps what its launches read: PARASHIFT_PDL, the prefetch
budgets). The GEMM choices are made once, at the first variant's capture, and shared; a
row's `same_bits` says whether every variant's output equals the first's. Layers and KV
pools as benchmarks/pdl_chain.py makes them (nothing stays in L2 from layer to layer)."""
import torch

from benchmarks import pdl_chain
from benchmarks.decode_throughput import env_settings, parse_settings
from parashift.kernels import fp8_gemm


def settings_of(variant: str) -> dict[str, str]:
    return {} if variant == "default" else parse_settings(variant)


def measure(batch: int, count: int, repeats: int, bandwidth: float, variants: list[str],
            context: int = 1024) -> dict:
    args = pdl_chain.step_args(count, True, batch, context, context + 1024)
    layers = args[2]
    graphs, outputs = pdl_chain.variant_graphs(
        variants, settings_of, lambda name: pdl_chain.step(*args, fp8_input=True)[0].clone())
    results = pdl_chain.replayed_fractions(graphs, layers, True, batch, context, count,
                                           bandwidth, repeats, alternate=True)[0]
    first = variants[0]
    pdl_chain.ratios_to_first(results, first)
    same = all(torch.equal(outputs[first], out) for out in outputs.values())
    del graphs, layers
    torch.cuda.empty_cache()
    return dict(batch=batch, layers=count, variants=results, same_bits=same,
                chosen=fp8_gemm.chosen())


def main():
    p = pdl_chain.variant_parser(batch_sizes=[64], repeats=21)
    p.add_argument("--variants", nargs="+", default=["default"],
                   type=lambda v: v if v == "default" else env_settings(v))
    args = p.parse_args()
    pdl_chain.run_rows(args, lambda _, batch, bandwidth: measure(
        batch, args.layers, args.repeats, bandwidth, args.variants))


if __name__ == "__main__":
    main()
