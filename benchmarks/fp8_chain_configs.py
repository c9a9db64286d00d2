"""Each FP8 projection's GEMM config at one row timed where decode runs it (issue 60): in the
8B shape's 32 decode layers (benchmarks/pdl_chain.py's, each with weights and a KV pool of its
own; PDL, CUDA graphs, the L2 prefetch as the engine's blocks launch it), one projection's
config forced to each of its `--top` fastest candidates as `fp8_gemm.linear` times them alone,
the others as chosen, the graphs replayed in turn (interleaved repeats), median µs a layer
against the chosen configs' graph.

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_chain_configs.py [--layers 32] [--repeats 11]
    [--top 4] [--projections qkv o gate_up down] [--settings NAME=VALUE[,..]] [--output F]
--settings: the environment while choosing, timing and capturing (e.g.
PARASHIFT_GEMM_TIMING=graph). The norms and SiLU-and-mul hand qkv, gate_up and down their
rows in E4M3 (layers/fp8_input.py), for the configs that multiply E4M3 by E4M3. A row per (projection, config): its time alone (the choice's
timing) and the chain's µs a layer, `delta_us` against the chosen configs' graph."""
import argparse
import json

import torch

from benchmarks import pdl_chain
from benchmarks.decode_throughput import copy_bandwidth, env_settings, environment, \
    parse_settings
from benchmarks.l2_prefetch_chain import Prefetcher
from parashift.kernels import fp8_gemm, gemm_timing

def alone_us(weight, scale) -> dict:
    """{config: µs a call} as `fp8_gemm.linear` times a one-row call of this weight."""
    x = torch.randn(1, weight.shape[1], device="cuda", dtype=torch.bfloat16)
    with gemm_timing.timing_launches():
        timings = fp8_gemm.timings_ms(x, weight, scale, None)
    return {config: 1e3 * ms for config, ms in timings.items()}


def measure(count: int, repeats: int, top: int, projections: list[str], bandwidth: float,
            context: int = 1024) -> dict:
    args = pdl_chain.step_args(count, True, 1, context, context + 1024)
    layers = args[2]
    prefetcher = Prefetcher(layers)
    graphs = {}

    def capture(name):
        def run():
            with prefetcher.wrapping({}):
                pdl_chain.step(*args, fp8_input=True)
        graphs[name] = pdl_chain.capture(run)
    capture("chosen")
    chosen = fp8_gemm.chosen()
    rows = []
    for name in projections:
        weight, scale = layers[0].weights[name]
        key = fp8_gemm._key(1, weight, torch.bfloat16, weight.device, False)
        picked = fp8_gemm._choices[key]
        timed = alone_us(weight, scale)
        for config in sorted(timed, key=timed.get)[:top]:
            label = fp8_gemm._label(config)
            rows.append(dict(proj=name, config=label, alone_us=round(timed[config], 2),
                             chosen=config == picked))
            rows[-1]["graph"] = "chosen" if config == picked else f"{name}: {label}"
            if config != picked:
                fp8_gemm._choices[key] = config
                capture(rows[-1]["graph"])
                fp8_gemm._choices[key] = picked
    results = pdl_chain.replayed_fractions(graphs, layers, True, 1, context, count, bandwidth,
                                           repeats)[0]
    base = results["chosen"]["us_per_layer"]
    for row in rows:
        row["us_per_layer"] = results[row["graph"]]["us_per_layer"]
        row["delta_us"] = round(row["us_per_layer"] - base, 2)
    del graphs, layers
    torch.cuda.empty_cache()
    return dict(chosen_us_per_layer=base, rows=rows, chosen=chosen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--top", type=int, default=4)
    p.add_argument("--projections", nargs="+", default=list(pdl_chain.SHAPES),
                   choices=list(pdl_chain.SHAPES))
    p.add_argument("--settings", type=env_settings, default=None)
    pdl_chain.add_no_dot_configs(p)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    pdl_chain.apply_no_dot_configs(args)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    with environment(parse_settings(args.settings) if args.settings else {}):
        result = measure(args.layers, args.repeats, args.top, args.projections, bandwidth)
    result.update(device=torch.cuda.get_device_name(), settings=args.settings,
                  copy_bandwidth_tb_s=bandwidth / 1e12)
    print(json.dumps(result, indent=1), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
