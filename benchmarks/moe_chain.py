"""Qwen3-30B-A3B's MoE layers as a decode step runs them (issue 61, item 2): per layer the
router (at one token the one-launch kernels/moe_router.py, else the gate GEMM and the routing
kernel) and then the experts, each layer's output the next one's input, `--layers` layers of
their own weights (so every layer reads its experts from HBM, as a step's 48 do), captured in
one CUDA graph with PDL as the engine launches it. Variants of the experts are replayed in
turn (kernels/gemm_timing.py: rounds, medians); µs per layer, and the fraction of the
layer's touched-bytes floor (its distinct routed experts' and router's bytes at the measured
copy bandwidth) for the router and experts together. `router` is the router alone.

At one or two tokens (the small path, kernels/moe_small.py): "small" (the default tiles) and
tiles beside them ("up n,k,w" with the default down tile, "down n,k,w" with the default
gate_up). At 64 tokens (the grouped GEMMs): "unfused" (PARASHIFT_MOE_DECODE_FUSED=0: two fills,
SiLU·mul and torch's sum beside the GEMMs), "fused" (kernels/moe_decode.py's default tiles)
and other tiles ("up n,k,w,s", "down n,k,w,s"). Each layer's router runs on random rows of
its own, so that 64 tokens touch ~126 experts a layer as a model's do. Each row holds the largest difference of each
variant's first-layer output from the first experts variant's (a check, not a timing).

Usage (GPU): python3 benchmarks/moe_chain.py [--tokens 1 64] [--layers 16] [--output F]"""
import argparse
import contextlib
import json
import os

import torch

from benchmarks.decode_throughput import copy_bandwidth
from parashift.kernels import fused_moe, gemm_timing, moe_decode, moe_router, moe_small
from parashift.layers.fused_moe import route
from parashift.layers.linear import linear as dense_linear

# (BLOCK_N, BLOCK_K, warps): more weight bytes in flight a program or more programs an SM
SMALL_UP = [(8, 512, 4), (8, 1024, 8), (16, 512, 8), (32, 128, 4)]
SMALL_DOWN = [(8, 256, 8), (4, 256, 8), (4, 512, 8), (16, 64, 8)]
FUSED_UP = [(64, 64, 4, 4), (64, 128, 4, 4), (32, 256, 2, 3), (32, 128, 4, 4)]
FUSED_DOWN = [(256, 64, 8, 3), (128, 64, 4, 4), (128, 128, 4, 4), (64, 256, 2, 3)]


def layers(cfg: dict, count: int) -> list[tuple]:
    """`count` layers of (router [E, H], gate_up [E, 2 I, H], down [E, H, I]), bf16, random."""
    e, h, i = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    made = []
    for _ in range(count):
        router = torch.randn(e, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5
        gate_up = torch.empty(e, 2 * i, h, device="cuda", dtype=torch.bfloat16)
        down = torch.empty(e, h, i, device="cuda", dtype=torch.bfloat16)
        for w, k in ((gate_up, h), (down, i)):
            for expert in range(e):  # no fp32 copy of the whole layer
                w[expert].normal_(0, k ** -0.5)
        made.append((router, gate_up, down))
    return made


def routed(x: torch.Tensor, router: torch.Tensor, cfg: dict) -> tuple:
    """(weights, ids) as layers/fused_moe.Router.route takes them on CUDA."""
    top_k, renormalize = cfg["num_experts_per_tok"], cfg["norm_topk_prob"]
    if moe_router.fits(x, router, top_k):
        return moe_router.route_from_hidden(x, router, top_k, renormalize)
    return route(dense_linear(x, router, None), top_k, renormalize)


@contextlib.contextmanager
def env(name: str, value: str):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def small_variants() -> dict:
    def with_tiles(up=None, down=None):
        def run(x, w, ids, gate_up, down_w):
            default = moe_small.choose_tiles(ids.shape[0], ids.shape[1], down_w.shape[2],
                                             down_w.shape[1], 2, x.device)
            tiles = (up or default[0], down or default[1])
            return moe_small.small_experts(x, w, ids, gate_up, down_w, 0, None, tiles)
        return run

    variants = {"small": with_tiles()}
    variants.update({f"up {','.join(map(str, t))}": with_tiles(up=t) for t in SMALL_UP})
    variants.update({f"down {','.join(map(str, t))}": with_tiles(down=t) for t in SMALL_DOWN})
    return variants


def grouped_variants() -> dict:
    def unfused(x, w, ids, gate_up, down):
        with env(moe_decode.ENV, "0"):
            return fused_moe.grouped_experts(x, w, ids, gate_up, down)

    def fused(up=None, down=None):
        def run(x, w, ids, gate_up, down_w):
            tiles = moe_decode.tiles_for(down_w.shape[2], down_w.shape[1])
            tiles = {**tiles, "gate_up": up or tiles["gate_up"], "down": down or tiles["down"]}
            return fused_moe.prefill_experts(x, w, ids, gate_up, down_w, tiles=tiles)
        return run

    variants = {"unfused": unfused, "fused": fused()}
    variants.update({f"up {','.join(map(str, t))}": fused(up=t) for t in FUSED_UP})
    variants.update({f"down {','.join(map(str, t))}": fused(down=t) for t in FUSED_DOWN})
    return variants


def chain(experts, weights: list[tuple], x0: torch.Tensor, routes: list[torch.Tensor],
          cfg: dict):
    """candidate(i) of gemm_timing.replayed_timings_ms: layer i's experts on the output of
    layer i-1, its router on routes[i] (random rows of its own: a chain's outputs grow
    alike, and routed on them 64 tokens touched ~37 experts where a model's touch ~126)."""
    state = {}

    def run(i: int):
        x = state.get(i, x0)
        router, gate_up, down = weights[i]
        w, ids = routed(routes[i], router, cfg)
        state[i + 1] = x if experts is None else experts(x, w, ids, gate_up, down)
        return state[i + 1]
    return run


def floor_us(routes: list[torch.Tensor], weights: list[tuple], cfg: dict,
             bandwidth: float) -> float:
    """Mean over the layers of the distinct routed experts' and the router's bytes, in µs
    at `bandwidth` bytes/s, each layer's router on its routes[i] as the chain runs it."""
    total = 0.0
    for x, (router, gate_up, down) in zip(routes, weights):
        _, ids = routed(x, router, cfg)
        per_expert = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
        total += ids.unique().numel() * per_expert + router.numel() * router.element_size()
    return total / len(weights) / bandwidth * 1e6


def measure(cfg: dict, tokens: int, weights: list[tuple], bandwidth: float) -> dict:
    x0 = torch.randn(tokens, cfg["hidden_size"], device="cuda", dtype=torch.bfloat16)
    routes = [torch.randn_like(x0) for _ in weights]
    pairs = tokens * cfg["num_experts_per_tok"]
    variants = small_variants() if moe_small.takes(pairs) else grouped_variants()
    first = next(iter(variants))
    router, gate_up, down = weights[0]
    w, ids = routed(x0, router, cfg)
    reference = variants[first](x0, w, ids, gate_up, down).float()
    diffs = {}
    for name, fn in variants.items():
        try:
            diffs[name] = (fn(x0, w, ids, gate_up, down).float() - reference).abs().max().item()
        except Exception as exc:  # noqa: BLE001  a tile this device cannot compile or run
            diffs[name] = f"failed: {exc}"[:200]
    candidates = {"router": chain(None, weights, x0, routes, cfg)}
    candidates.update({name: chain(fn, weights, x0, routes, cfg)
                       for name, fn in variants.items()})
    timings = gemm_timing.replayed_timings_ms(candidates, len(weights))
    floor = floor_us(routes, weights, cfg, bandwidth)
    us = {name: round(ms * 1e3, 2) for name, ms in timings.items()}
    fastest = min((n for n in us if n != "router"), key=us.get)
    return {"tokens": tokens, "layers": len(weights), "floor_us": round(floor, 2), "us": us,
            "fraction": {n: round(floor / t, 3) for n, t in us.items() if n != "router"},
            "fastest": fastest, "reference": first,
            "max_abs_diff_first_layer": diffs}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    cfg = json.load(open(args.model))
    weights = layers(cfg, args.layers)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    rows = []
    for tokens in args.tokens:
        rows.append(measure(cfg, tokens, weights, bandwidth))
        print(json.dumps(rows[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(),
                       "bandwidth_tb_s": bandwidth / 1e12, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
