"""One MoE layer's experts at decode batch sizes: the small-batch GEMVs (kernels/moe_small.py)
against the grouped GEMM (kernels/fused_moe.grouped_experts, its pair sort included), bf16
and FP8 experts, in µs and as a fraction of the touched-bytes floor (the distinct routed
experts' bytes at --bandwidth TB/s). Timed as decode runs them (kernels/gemm_timing.py): 16
calls back to back in a CUDA graph, each on another routing and another copy of the
experts, the candidates' replays interleaved over rounds, medians. Then the small path's
tiles are swept (gate_up's with the default down, then down's with the best gate_up) and the
fastest printed as a PARASHIFT_MOE_SMALL_TILES value. Each row also holds the largest
difference between the two paths' outputs (a check, not a timing).

Usage (GPU): python3 benchmarks/moe_small.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --tokens 1 2 8 16 [--output moe_small.json]"""
import argparse
import json

import torch

from parashift.kernels import fused_moe, gemm_timing, moe_small
from parashift.layers.fused_moe import route
from parashift.quantization.fp8 import quantize_rows

CALLS = gemm_timing.CALLS_PER_REPLAY
WEIGHT_COPIES = 2  # each routing's experts in another copy: few stay in L2 between calls
UP_TILES = {2: [(16, 256, 4), (8, 512, 4), (32, 128, 4), (16, 512, 8), (32, 256, 8)],
            1: [(16, 512, 4), (8, 1024, 4), (32, 256, 4), (16, 1024, 8), (16, 256, 4)]}
DOWN_TILES = {2: [(8, 128, 8), (8, 64, 4), (16, 64, 8), (8, 256, 8), (4, 256, 8), (16, 32, 4)],
              1: [(8, 256, 8), (8, 128, 4), (16, 128, 8), (4, 512, 8), (8, 512, 8)]}


def experts(cfg: dict, fp8: bool) -> list[tuple]:
    """WEIGHT_COPIES of (gate_up, down, scales or None), random, of one layer."""
    e, h, i = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    copies = []
    for _ in range(WEIGHT_COPIES):
        gate_up = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5
        down = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5
        if fp8:
            (gate_up, gate_up_scale), (down, down_scale) = quantize_rows(gate_up), quantize_rows(down)
            copies.append((gate_up, down, (gate_up_scale, down_scale)))
        else:
            copies.append((gate_up, down, None))
    return copies


def routings(cfg: dict, tokens: int) -> list[tuple]:
    """CALLS of (x, weights, ids), random logits routed as the model routes them."""
    calls = []
    for _ in range(CALLS):
        x = torch.randn(tokens, cfg["hidden_size"], device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, cfg["num_experts"], device="cuda", dtype=torch.bfloat16)
        calls.append((x, *route(logits, cfg["num_experts_per_tok"], cfg["norm_topk_prob"])))
    return calls


def floor_us(calls: list[tuple], layer: tuple, bandwidth: float) -> float:
    """The mean over the calls of the distinct routed experts' bytes, in µs at `bandwidth`."""
    gate_up, down, scales = layer
    per_expert = sum(t[0].numel() * t.element_size() for t in (gate_up, down, *(scales or ())))
    distinct = sum(ids.unique().numel() for _, _, ids in calls) / len(calls)
    return distinct * per_expert / bandwidth * 1e6


def time_us(candidates: dict, layers: list[tuple], calls: list[tuple]) -> dict:
    """Median µs per call of each candidate(x, weights, ids, gate_up, down, scales)."""
    def bound(fn):
        return lambda i: fn(*calls[i], *layers[i % len(layers)])
    timings = gemm_timing.replayed_timings_ms({k: bound(fn) for k, fn in candidates.items()},
                                              len(calls))
    return {k: ms * 1e3 for k, ms in timings.items()}


def small(tiles=None):
    return lambda x, w, ids, gate_up, down, scales: moe_small.small_experts(
        x, w, ids, gate_up, down, 0, scales, tiles)


def grouped(x, w, ids, gate_up, down, scales):
    return fused_moe.grouped_experts(x, w, ids, gate_up, down, 0, scales)


def measure(cfg: dict, tokens: int, fp8: bool, layers: list[tuple], bandwidth: float) -> dict:
    calls = routings(cfg, tokens)
    gate_up, down, scales = layers[0]
    x, w, ids = calls[0]
    diff = (small()(x, w, ids, gate_up, down, scales).float()
            - grouped(x, w, ids, gate_up, down, scales).float()).abs().max().item()
    default = moe_small.choose_tiles(tokens, cfg["num_experts_per_tok"],
                                     cfg["moe_intermediate_size"], cfg["hidden_size"],
                                     gate_up.element_size(), x.device)
    first = time_us({"grouped": grouped, "small": small(default),
                     **{("up", t): small((t, default[1])) for t in UP_TILES[gate_up.element_size()]}},
                    layers, calls)
    ups = {k[1]: v for k, v in first.items() if isinstance(k, tuple)}
    best_up = min(ups, key=ups.get) if ups else default[0]
    second = time_us({("down", t): small((best_up, t)) for t in DOWN_TILES[gate_up.element_size()]},
                     layers, calls)
    downs = {k[1]: v for k, v in second.items()}
    best_down = min(downs, key=downs.get) if downs else default[1]
    floor = floor_us(calls, layers[0], bandwidth)
    row = {"tokens": tokens, "experts": "fp8" if fp8 else "bf16", "floor_us": round(floor, 1),
           "grouped_us": round(first.get("grouped", float("nan")), 1),
           "small_us": round(first.get("small", float("nan")), 1), "default_tiles": default,
           "best_tiles": (best_up, best_down),
           "best_us": round(downs.get(best_down, float("nan")), 1),
           "up_tiles_us": {str(k): round(v, 1) for k, v in ups.items()},
           "down_tiles_us": {str(k): round(v, 1) for k, v in downs.items()},
           "max_abs_diff_small_vs_grouped": diff}
    for name in ("grouped", "small", "best"):
        row[f"{name}_fraction"] = round(floor / row[f"{name}_us"], 3)
    row["small_over_grouped"] = round(row["small_us"] / row["grouped_us"], 3)
    row["best_env"] = ",".join(str(n) for tiles in row["best_tiles"] for n in tiles)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8, 16])
    p.add_argument("--experts", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    p.add_argument("--bandwidth", type=float, default=4.8, help="TB/s of the floor")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    cfg = json.load(open(args.model))
    rows = []
    for kind in args.experts:
        layers = experts(cfg, kind == "fp8")
        for tokens in args.tokens:
            rows.append(measure(cfg, tokens, kind == "fp8", layers, args.bandwidth * 1e12))
            print(json.dumps(rows[-1]), flush=True)
        del layers
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(),
                       "bandwidth_tb_s": args.bandwidth, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
