"""One MoE layer's experts at a prefill's size (Qwen3-30B-A3B: 4,096 tokens x 8 of 128
experts, ~256 pairs an expert): the grouped GEMMs alone over a sweep of tiles, in ms and
TFLOP/s, then the whole experts call (pair sort included) unfused (PARASHIFT_MOE_PREFILL=0:
zeroed outputs, SiLU·mul and torch's top-k sum apart) against the prefill path
(kernels/moe_prefill.py) with its table's tiles and with the sweep's fastest, which it writes
as a tiles file (--tiles-out: PARASHIFT_MOE_PREFILL_TILES reads it; its row belongs in
moe_prefill.TILES). Each row also holds the largest difference from the unfused path's
output (a check, not a timing). Times: triton.testing.do_bench medians (L2 flushed; a layer's
experts are 1.2 GB in bf16, far past L2 anyway).

Usage (GPU): python3 benchmarks/moe_prefill.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --tokens 4096 [--output moe_prefill.json] [--tiles-out moe_prefill_tiles.json]
(--device cpu: a smoke run under TRITON_INTERPRET=1, float32, a few tiles, one call each.)"""
import argparse
import json
import os
import time

import torch
import triton.testing

from parashift.kernels import fused_moe, moe_prefill
from parashift.layers.fused_moe import route

MATRIX_RATE = 788e12  # H200 dense bf16, ../shared/workloads.md
# (block_m, BLOCK_N, BLOCK_K, warps, stages)
GATE_UP_TILES = [(64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3),
                 (64, 128, 64, 8, 3), (64, 64, 128, 4, 3), (64, 128, 32, 8, 4),
                 (64, 64, 32, 4, 5), (128, 64, 64, 4, 3), (128, 64, 64, 8, 3),
                 (128, 128, 64, 8, 3), (128, 128, 32, 8, 4), (128, 64, 128, 8, 3)]
DOWN_TILES = [(64, 128, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 8, 3),
              (64, 256, 64, 8, 3), (64, 128, 128, 4, 3), (64, 128, 32, 4, 4),
              (64, 64, 128, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3),
              (128, 128, 32, 8, 4), (128, 64, 64, 4, 3), (128, 128, 128, 8, 3),
              (64, 128, 64, 4, 4), (128, 128, 64, 8, 4)]


def layer(cfg: dict, tokens: int, device: str) -> tuple:
    e, h, i = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    like = dict(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    x = torch.randn(tokens, h, **like)
    logits = torch.randn(tokens, e, **like)
    weights, ids = route(logits, cfg["num_experts_per_tok"], cfg["norm_topk_prob"])
    gate_up = torch.randn(e, 2 * i, h, **like) * h ** -0.5
    down = torch.randn(e, h, i, **like) * i ** -0.5
    return x, weights, ids, gate_up, down


def ms(fn) -> float | None:
    try:
        if not torch.cuda.is_available():  # the CPU smoke run: one call
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return triton.testing.do_bench(fn, warmup=3, rep=25, return_mode="median")
    except Exception as exc:  # noqa: BLE001  a tile that does not compile or fit
        print(f"  failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        return None


def sweep(name: str, tiles: list[tuple], run, flops: float) -> list[dict]:
    rows = []
    for tile in tiles:
        t = ms(lambda tile=tile: run(tile))
        row = dict(gemm=name, block_m=tile[0], tiles=list(tile[1:]), ms=t,
                   tflops=None if t is None else round(flops / t / 1e9, 1))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def fastest(rows: list[dict], block_m: int) -> dict | None:
    timed = [r for r in rows if r["ms"] is not None and r["block_m"] == block_m]
    return min(timed, key=lambda r: r["ms"]) if timed else None


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else device


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--output", default=None)
    p.add_argument("--tiles-out", default=None)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    cfg = json.load(open(args.model))
    x, weights, ids, gate_up, down = layer(cfg, args.tokens, args.device)
    up_tiles, down_tiles = GATE_UP_TILES, DOWN_TILES
    if args.device == "cpu":  # the smoke run's interpreter: small tiles, one of each rows
        up_tiles, down_tiles = [(64, 32, 32, 4, 1), (128, 32, 32, 4, 1)], [(64, 32, 32, 4, 1)]
    pairs, hidden, inter = ids.numel(), x.shape[1], down.shape[2]
    sorts = {m: fused_moe.sort_pairs(ids, gate_up.shape[0], 0, m) for m in (64, 128)}
    h = moe_prefill.gate_up_silu(x, gate_up, *sorts[64], pairs, ids.shape[1],
                                 moe_prefill.DEFAULT_TILES["gate_up"])
    flat_weights = weights.flatten().contiguous()
    rows = sweep("gate_up+silu", up_tiles, lambda t: moe_prefill.gate_up_silu(
        x, gate_up, *sorts[t[0]], pairs, ids.shape[1], t[1:]), 2 * pairs * hidden * 2 * inter)
    rows += sweep("gate_up unfused", [(64, 128, 64, 4, 3)], lambda t: fused_moe.grouped_gemm(
        x, gate_up, *sorts[t[0]], pairs, ids.shape[1], tiles=t[1:]), 2 * pairs * hidden * 2 * inter)
    rows += sweep("down", down_tiles, lambda t: fused_moe.grouped_gemm(
        h, down, *sorts[t[0]], pairs, 1, flat_weights, t[1:], zero=False),
        2 * pairs * inter * hidden)
    best = None
    for block_m in (64, 128):
        up, dn = fastest([r for r in rows if r["gemm"] == "gate_up+silu"], block_m), \
            fastest([r for r in rows if r["gemm"] == "down"], block_m)
        if up and dn and (best is None or up["ms"] + dn["ms"] < best[0]):
            best = (up["ms"] + dn["ms"], {"block_m": block_m, "gate_up": up["tiles"],
                                          "down": dn["tiles"]})
    os.environ[moe_prefill.ENV] = "0"
    reference = fused_moe.grouped_experts(x, weights, ids, gate_up, down)
    calls = {"unfused": lambda: fused_moe.grouped_experts(x, weights, ids, gate_up, down)}
    os.environ[moe_prefill.ENV] = "1"
    calls["prefill, table tiles"] = lambda: fused_moe.prefill_experts(
        x, weights, ids, gate_up, down)
    if best:
        calls["prefill, swept tiles"] = lambda: fused_moe.prefill_experts(
            x, weights, ids, gate_up, down, tiles=best[1])
    floor_ms = 2 * pairs * hidden * 3 * inter / MATRIX_RATE * 1e3
    for name, call in calls.items():
        t = ms(call)
        row = dict(gemm="experts call: " + name, ms=t, floor_ms=round(floor_ms, 4),
                   fraction=None if t is None else round(floor_ms / t, 3),
                   max_abs_diff=float((call() - reference).abs().max()))
        print(json.dumps(row), flush=True)
        rows.append(row)
    if best and args.tiles_out:
        with open(args.tiles_out, "w") as f:
            json.dump({**best[1], "device": device_name(args.device),
                       "tokens": args.tokens, "gemm_ms": round(best[0], 4)}, f)
    print("best tiles:", best and json.dumps(best[1]))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, tokens=args.tokens, pairs=pairs,
                           device=device_name(args.device), best=best and best[1],
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
