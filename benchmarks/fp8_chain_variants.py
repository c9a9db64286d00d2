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
import argparse
import statistics

import torch

from benchmarks import pdl_chain
from benchmarks.decode_throughput import copy_bandwidth, env_settings, environment, \
    parse_settings
from parashift.kernels import fp8_gemm


def settings_of(variant: str) -> dict[str, str]:
    return {} if variant == "default" else parse_settings(variant)


def measure(batch: int, count: int, repeats: int, bandwidth: float, variants: list[str],
            context: int = 1024) -> dict:
    args = pdl_chain.step_args(count, True, batch, context, context + 1024)
    layers = args[2]
    graphs, outputs = {}, {}
    for name in variants:
        with environment(settings_of(name)):
            graphs[name] = pdl_chain.capture(lambda: outputs.__setitem__(name, pdl_chain.step(
                *args, fp8_input=True)[0].clone()))
    samples = {name: [] for name in graphs}
    for r in range(repeats):
        for name in (variants if r % 2 == 0 else variants[::-1]):
            samples[name].append(pdl_chain.replay_ms(graphs[name]))
    weight_bytes = sum(layers[0].weights[name][0].numel() for name in pdl_chain.SHAPES)
    kv_bytes = 2 * batch * (context + 1) * pdl_chain.KV_HEADS * pdl_chain.HEAD_DIM * 2
    results = {name: pdl_chain.floor_fractions(statistics.median(t) / 1e3 / count,
                                               weight_bytes, kv_bytes, bandwidth)
               for name, t in samples.items()}
    first = variants[0]
    base = results[first]["us_per_layer"]
    for name, row in results.items():
        row[f"{first}_over_this"] = round(base / row["us_per_layer"], 4)
    same = all(torch.equal(outputs[first], out) for out in outputs.values())
    del graphs, layers
    torch.cuda.empty_cache()
    return dict(batch=batch, layers=count, variants=results, same_bits=same,
                chosen=fp8_gemm.chosen())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--variants", nargs="+", default=["default"],
                   type=lambda v: v if v == "default" else env_settings(v))
    pdl_chain.add_no_dot_configs(p)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    pdl_chain.apply_no_dot_configs(args)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    rows = []
    for batch in args.batch_sizes:
        rows.append(measure(batch, args.layers, args.repeats, bandwidth, args.variants))
        pdl_chain.report(rows, bandwidth, args.output)


if __name__ == "__main__":
    main()
