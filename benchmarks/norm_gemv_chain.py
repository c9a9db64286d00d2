"""The RMSNorm (with the residual add) inside the next layer's GEMV (kernels/norm_gemv.py;
issue 61) on the 8B shape's decode kernels, one GPU.

Usage (GPU): PYTHONPATH=. python3 benchmarks/norm_gemv_chain.py [--weights fp8 bf16]
    [--batch-sizes 1 2 4] [--layers 32] [--repeats 15] [--variants plain silu norm norm_silu]
    [--sweep] [--output F]
A step's layers (benchmarks/pdl_chain.py's kernels, PDL as the engine launches, CUDA graphs)
in each variant: "plain" (the norm kernel, then the GEMM the dispatch chose; SiLU-and-mul a
kernel of its own: FP8's engine default), "silu" (SiLU-and-mul in the gate_up GEMV where
gated_gemv.py chose it: bf16's engine default), "norm" (each norm in the qkv or gate_up GEMV
where norm_gemv.py chose it), "norm_silu" (both). The graphs are replayed in turn
(interleaved repeats): median µs per layer, each variant's choices, max |difference| of the
outputs against the first variant's. --sweep also times every norm_gemv candidate against
the unfused pair at each shape (qkv; gate_up with and without SiLU) and row count, as the
choice times them (in the decode chain: PDL on, each call after a kernel writing its input),
and the pair's GEMM alone."""
import json
import time

import torch

from benchmarks import pdl_chain
from parashift.kernels import fp8_gemm, gated_gemv, gemm_timing, norm_gemv, silu_mul, skinny_gemm

EPS = pdl_chain.EPS
VARIANTS = {"plain": (False, False), "silu": (False, True), "norm": (True, False),
            "norm_silu": (True, True)}


def weight_and_scale(weights) -> tuple[torch.Tensor, torch.Tensor | None]:
    return weights if isinstance(weights, tuple) else (weights, None)


def normed_linear(x, residual, norm_weight, weights, norm: bool, silu_config=None):
    """(the projection of rms_norm(x + residual), x + residual): in one GEMV where `norm` and
    norm_gemv chose it, else the norm kernel then the GEMM (SiLU-and-mul in it where
    silu_config is given)."""
    weight, scale = weight_and_scale(weights)
    config = (norm_gemv.choice(x, residual, norm_weight, EPS, weight, scale, None, silu_config)
              if norm else None)
    if config is not None:
        return norm_gemv.fused_linear(x, residual, norm_weight, EPS, weight, scale, None,
                                      config, silu_config is not None)
    return norm_gemv.unfused_linear(x, residual, norm_weight, EPS, weight, scale, None,
                                    silu_config)


def step(x, residual, layers, meta, positions, cos_sin, backend, norm: bool, silu: bool):
    for layer in layers:
        qkv, residual = normed_linear(x, residual, layer.norms[0], layer.weights["qkv"], norm)
        x = pdl_chain.attention(qkv, layer, meta, positions, cos_sin, backend)
        weight, scale = weight_and_scale(layer.weights["gate_up"])
        silu_config = gated_gemv.choice("gate_up", x, weight, scale, None) if silu else None
        act, residual = normed_linear(x, residual, layer.norms[1], layer.weights["gate_up"],
                                      norm, silu_config)
        if silu_config is None:
            act = silu_mul.silu_and_mul(act)
        x = pdl_chain.linear(act, layer.weights["down"])
    return x, residual


def choices() -> dict:
    return dict(fp8=fp8_gemm.chosen(), bf16=skinny_gemm.chosen(), gated=gated_gemv.chosen(),
                norm=norm_gemv.chosen())


def sweep(layer: pdl_chain.Layer, batch: int) -> list[dict]:
    """Every candidate's µs a call against the unfused pair's, per shape."""
    x = torch.randn(batch, pdl_chain.HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    rows = []
    for name, silu in (("qkv", False), ("gate_up", False), ("gate_up", True)):
        weight, scale = weight_and_scale(layer.weights[name])
        silu_config = gated_gemv.choice("gate_up", x, weight, scale, None) if silu else None
        if silu and silu_config is None:
            rows.append(dict(shape=name, rows=batch, silu=True, skipped="no SiLU GEMV chosen"))
            continue
        norm_gemv.unfused_linear(x, residual, layer.norms[0], EPS, weight, scale, None,
                                 silu_config)
        with gemm_timing.timing_launches(chain=True):
            timings = norm_gemv.timings_ms(x, residual, layer.norms[0], EPS, weight, scale,
                                           None, silu_config, norm_gemv.candidates(weight))
            alone = gemm_alone_us(x, weight, scale, silu_config)
        rows.append(dict(shape=name, rows=batch, silu=silu, gemm_alone_us=alone,
                         us={norm_gemv.label(c): round(1e3 * t, 2) for c, t in timings.items()}))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def gemm_alone_us(x, weight, scale, silu_config) -> float:
    """µs a call of the GEMM the unfused pair runs after its norm, timed alone."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x, chain=True)
    if silu_config is None:
        run = lambda i: gated_gemv.dispatched_linear(xin, weights[i], scale, None)  # noqa: E731
    else:
        run = lambda i: gated_gemv.fused_linear(  # noqa: E731
            "gate_up", xin, weights[i], scale, None, silu_config)
    return round(1e3 * gemm_timing.replayed_timings_ms({"gemm": run}, len(weights),
                                                       chain)["gemm"], 2)


def measure(weights: str, batch: int, count: int, repeats: int, bandwidth: float,
            variants: list[str], do_sweep: bool) -> dict:
    fp8 = weights == "fp8"
    context = 1024
    args = pdl_chain.step_args(count, fp8, batch, context, context + 1024)
    layers = args[2]
    graphs, outputs, setup_s = {}, {}, {}
    for name in variants:
        norm, silu = VARIANTS[name]
        started = time.perf_counter()
        graphs[name] = pdl_chain.capture(lambda: outputs.__setitem__(
            name, step(*args, norm, silu)[0].clone()))
        setup_s[name] = round(time.perf_counter() - started, 1)
    first = variants[0]
    results = pdl_chain.replayed_fractions(graphs, layers, fp8, batch, context, count,
                                           bandwidth, repeats)[0]
    diffs = pdl_chain.largest_differences(outputs, first)
    swept = sweep(layers[0], batch) if do_sweep else []
    del graphs, layers, args
    torch.cuda.empty_cache()
    return dict(weights=weights, batch=batch, layers=count, variants=results,
                **{f"speedup_{name}_vs_{first}": round(results[first]["us_per_layer"]
                                                       / results[name]["us_per_layer"], 4)
                   for name in variants[1:]},
                **{f"max_abs_diff_vs_{first}": diffs}, setup_s=setup_s, chosen=choices(),
                sweep=swept)


def main():
    p = pdl_chain.variant_parser(batch_sizes=[1, 2, 4], repeats=15, weights=["fp8", "bf16"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="the first is the others' reference")
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args()
    pdl_chain.run_rows(args, lambda weights, batch, bandwidth: measure(
        weights, batch, args.layers, args.repeats, bandwidth, args.variants, args.sweep))


if __name__ == "__main__":
    main()
