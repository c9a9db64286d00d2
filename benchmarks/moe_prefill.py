"""One MoE layer's experts at a prefill's size (Qwen3-30B-A3B: 4,096 tokens x 8 of 128
experts, ~256 pairs an expert): the grouped GEMMs alone over a sweep of tiles and schedules
(kernels/moe_schedule.py's flags), in ms and TFLOP/s, beside torch._grouped_mm (CUTLASS) on
the same pairs' rows sorted and gathered ahead (a library's reference, its gather not timed),
then the whole experts call (pair sort included) unfused (PARASHIFT_MOE_PREFILL=0:
zeroed outputs, SiLU·mul and torch's top-k sum apart) against the prefill path
(kernels/moe_prefill.py) with its table's tiles and with the sweep's fastest, which it writes
as a tiles file (--tiles-out: PARASHIFT_MOE_PREFILL_TILES reads it; its row belongs in
moe_prefill.TILES). Each row also holds the largest difference from the unfused path's
output (a check, not a timing). Times: triton.testing.do_bench medians (L2 flushed; a layer's
experts are 1.2 GB in bf16, far past L2 anyway).

Usage (GPU): python3 benchmarks/moe_prefill.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --tokens 4096 [--jobs 8] [--output moe_prefill.json] [--tiles-out moe_prefill_tiles.json]
(--device cpu: a smoke run under TRITON_INTERPRET=1, float32, a few tiles, one call each;
--host-calls 1 makes its host times one call each too.)"""
import argparse
import json
import os
import time

import torch
import triton.testing

from parashift.kernels import fused_moe, moe_prefill
from parashift.layers.fused_moe import route

MATRIX_RATE = 788e12  # H200 dense bf16, ../shared/workloads.md
# (block_m, BLOCK_N, BLOCK_K, warps, stages, schedule): the schedule names
# kernels/moe_schedule.py's flags on ("-": none; "n": n_first, "s": split_tail, "t": tma,
# "j": joint, gate_up's only)
GATE_UP_TILES = [(128, 64, 64, 4, 3, "-"), (128, 64, 64, 4, 3, "n"), (128, 64, 64, 4, 3, "ns"),
                 (128, 64, 64, 4, 3, "nst"), (128, 64, 64, 8, 3, "nst"),
                 (128, 128, 64, 8, 3, "nst"), (128, 64, 64, 4, 4, "nst"),
                 (128, 64, 128, 8, 3, "nst"), (64, 128, 64, 4, 3, "nt"),
                 (128, 64, 64, 4, 3, "nstj"), (128, 128, 64, 8, 3, "nstj"),
                 (128, 64, 64, 4, 4, "nstj"), (64, 128, 64, 4, 3, "ntj")]
DOWN_TILES = [(128, 256, 64, 8, 3, "-"), (128, 256, 64, 8, 3, "n"), (128, 256, 64, 8, 3, "ns"),
              (128, 256, 64, 8, 3, "nst"), (128, 128, 64, 8, 3, "nst"),
              (128, 256, 128, 8, 2, "nst"), (128, 256, 64, 8, 4, "ns"),
              (128, 256, 64, 8, 4, "nst"), (64, 256, 64, 8, 3, "nt")]
FLAG_LETTERS = {"n": "n_first", "s": "split_tail", "t": "tma", "j": "joint"}


def schedule(letters: str) -> dict:
    return {flag: int(letter in letters) for letter, flag in FLAG_LETTERS.items()}


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


def host_ms(fn, calls: int = 20, synced: bool = False) -> float:
    """The median host time to issue one call (synced: each after the device has finished
    the one before, so that no queue ahead of it can hold the host)."""
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(calls):
        if synced and cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    if cuda:
        torch.cuda.synchronize()
    return round(sorted(times)[len(times) // 2], 4)


def sweep(name: str, tiles: list[tuple], run, flops: float) -> list[dict]:
    rows = []
    for tile in tiles:
        t = ms(lambda tile=tile: run(tile))
        row = dict(gemm=name, block_m=tile[0], tiles=list(tile[1:5]), schedule=tile[5], ms=t,
                   tflops=None if t is None else round(flops / t / 1e9, 1))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def fastest(rows: list[dict], block_m: int, letters: str) -> dict | None:
    timed = [r for r in rows if r["ms"] is not None and r["block_m"] == block_m
             and r["schedule"] == letters]
    return min(timed, key=lambda r: r["ms"]) if timed else None


def best_tiles(rows: list[dict]) -> tuple[float, dict] | None:
    """(the two GEMMs' ms, the tiles file's contents) of the fastest pair of one block_m and
    one schedule (the tiles file holds one set of flags for both GEMMs; joint is gate_up's
    alone)."""
    best = None
    up_rows = [r for r in rows if r["gemm"] == "gate_up+silu"]
    down_rows = [r for r in rows if r["gemm"] == "down"]
    for block_m in sorted({r["block_m"] for r in up_rows}):
        for letters in sorted({r["schedule"] for r in up_rows}):
            up = fastest(up_rows, block_m, letters)
            dn = fastest(down_rows, block_m, letters.replace("j", "") or "-")
            if up and dn and (best is None or up["ms"] + dn["ms"] < best[0]):
                best = (up["ms"] + dn["ms"], {"block_m": block_m, "gate_up": up["tiles"],
                                              "down": dn["tiles"], **schedule(letters)})
    return best


SUM_TILES = [(1024, 4), (2048, 4), (2048, 8), (512, 4), (1024, 8)]  # (BLOCK, warps)


def topk_sum_rows(one: "Layer") -> list[dict]:
    """The top-k sum kernel at a few blocks and warps (ms, TB/s of its reads and writes)."""
    y = torch.randn(one.pairs, one.x.shape[1], device=one.x.device, dtype=one.x.dtype)
    moved = (y.numel() + one.x.numel()) * y.element_size()
    rows = []
    for block, warps in SUM_TILES if one.x.is_cuda else SUM_TILES[:1]:
        t = ms(lambda: moe_prefill.topk_sum(y, one.ids, 0, one.gate_up.shape[0], block, warps))
        rows.append(dict(gemm="top-k sum", tiles=[block, warps], ms=t,
                         tbps=None if t is None else round(moved / t / 1e9, 2)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def grouped_mm_rows(x, ids, gate_up, down, flops_up: float, flops_down: float) -> list[dict]:
    """torch._grouped_mm (CUTLASS on sm_90) on the pairs' rows already sorted and gathered
    (no padding): what a library's grouped GEMM takes for the same two GEMMs, a reference."""
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None or not x.is_cuda:
        return []
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    offs = torch.bincount(flat, minlength=gate_up.shape[0]).cumsum(0).to(torch.int32)
    a = x[order // ids.shape[1]]
    h = torch.randn(a.shape[0], down.shape[2], device=x.device, dtype=x.dtype)
    rows = []
    for name, call, flops in (
            ("torch._grouped_mm gate_up (sorted rows)",
             lambda: grouped(a, gate_up.transpose(1, 2), offs=offs), flops_up),
            ("torch._grouped_mm down (sorted rows)",
             lambda: grouped(h, down.transpose(1, 2), offs=offs), flops_down)):
        t = ms(call)
        rows.append(dict(gemm=name, ms=t, tflops=None if t is None else round(flops / t / 1e9, 1)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else device


class Layer:
    """One layer's inputs, its pairs sorted at 64 and 128 rows a block, and the two GEMMs
    under a sweep row's tile (block_m, BLOCK_N, BLOCK_K, warps, stages, schedule)."""

    def __init__(self, cfg: dict, tokens: int, device: str):
        self.x, self.weights, self.ids, self.gate_up, self.down = layer(cfg, tokens, device)
        self.pairs = self.ids.numel()
        self.sorts = {m: fused_moe.sort_pairs(self.ids, self.gate_up.shape[0], 0, m)
                      for m in (64, 128)}
        self.h = moe_prefill.gate_up_silu(self.x, self.gate_up, *self.sorts[64], self.pairs,
                                          self.ids.shape[1], moe_prefill.DEFAULT_TILES["gate_up"])
        self.flat_weights = self.weights.flatten().contiguous()

    def gate_up_silu(self, t: tuple):
        return moe_prefill.gate_up_silu(self.x, self.gate_up, *self.sorts[t[0]], self.pairs,
                                        self.ids.shape[1], t[1:5], schedule=schedule(t[5]))

    def down_gemm(self, t: tuple):
        return fused_moe.grouped_gemm(self.h, self.down, *self.sorts[t[0]], self.pairs, 1,
                                      self.flat_weights, t[1:5], zero=False,
                                      schedule=schedule(t[5]))


def compile_share(model: str, tokens: int, device: str, share: list[tuple]) -> None:
    """A worker of --jobs: each (gemm, tile) of its share run once, compiling it into
    Triton's cache (the same shapes as the sweep's, so the sweep finds it there)."""
    one = Layer(json.load(open(model)), tokens, device)
    for gemm, tile in share:
        try:
            (one.gate_up_silu if gemm == "gate_up" else one.down_gemm)(tile)
        except Exception as exc:  # noqa: BLE001  the sweep reports it
            print(f"  compile {gemm} {tile}: {type(exc).__name__}", flush=True)
    if device == "cuda":
        torch.cuda.synchronize()


def precompile(args, up_tiles: list[tuple], down_tiles: list[tuple]) -> None:
    """The sweep's kernels compiled by --jobs processes side by side (one at a time they
    took most of the sweep's minute)."""
    import multiprocessing
    items = [("gate_up", t) for t in up_tiles] + [("down", t) for t in down_tiles]
    shares = [items[i::args.jobs] for i in range(args.jobs)]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        pool.starmap(compile_share, [(args.model, args.tokens, args.device, share)
                                     for share in shares if share])
    print(f"precompiled {len(items)} kernels in {time.perf_counter() - start:.1f} s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--output", default=None)
    p.add_argument("--tiles-out", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--jobs", type=int, default=0,
                   help="processes that compile the sweep's kernels first (0: none)")
    p.add_argument("--host-calls", type=int, default=20,
                   help="calls whose median is each experts call's host time (the CPU "
                        "smoke run: 1, each an interpreted second)")
    args = p.parse_args()
    cfg = json.load(open(args.model))
    up_tiles, down_tiles = GATE_UP_TILES, DOWN_TILES
    if args.device == "cpu":  # the smoke run's interpreter: small tiles, one of each rows
        up_tiles = [(64, 32, 32, 4, 1, "-"), (128, 32, 32, 4, 1, "nst")]
        down_tiles = [(64, 32, 32, 4, 1, "-"), (128, 32, 32, 4, 1, "nst")]
    if args.jobs and args.device == "cuda":
        precompile(args, up_tiles, down_tiles)
    one = Layer(cfg, args.tokens, args.device)
    x, weights, ids, gate_up, down = one.x, one.weights, one.ids, one.gate_up, one.down
    pairs, hidden, inter = one.pairs, x.shape[1], down.shape[2]
    flops_up, flops_down = 2 * pairs * hidden * 2 * inter, 2 * pairs * inter * hidden
    rows = sweep("gate_up+silu", up_tiles, one.gate_up_silu, flops_up)
    rows += sweep("down", down_tiles, one.down_gemm, flops_down)
    rows += grouped_mm_rows(x, ids, gate_up, down, flops_up, flops_down)
    rows += topk_sum_rows(one)
    best = best_tiles(rows)
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
                   host_ms=host_ms(call, args.host_calls),
                   host_ms_synced=host_ms(call, args.host_calls, synced=True),
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
