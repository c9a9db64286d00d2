"""One rank of a merged plan (Flying Serving) against static TP, on one GPU: the linear layers
of one decode step (every layer's qkv, o, gate_up and down; random weights, no
communication) of a rank that holds its full replica and runs its 1/w slice, under each
`--merge-weights` mode, against a rank of static TP=w holding only its shard; and the
load-time permute of a full replica (reorder, widths 2 and 4 on one rank: one nested
permutation).

Usage (GPU): python3 benchmarks/merge_weights.py --model benchmarks/shapes/llama-3.1-8b.json
CPU check:   python3 benchmarks/merge_weights.py --model benchmarks/shapes/tiny-llama.json \
                 --device cpu --dtype float32 --iters 3
"""
import argparse
import json
import time

import torch
from torch import nn

from parashift.context import StepContext, use_context, use_state
from parashift.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                     RowParallelLinear)
from parashift.parallel.narrow_weights import WEIGHT_MODES, Narrowing, make_narrow_weights
from parashift.parallel.plan import Plan
from parashift.parallel.state import GroupHandle, ParallelState

BASE = "base"


class LocalGroup(GroupHandle):
    """A TP group seen from one rank with no peers to talk to: GEMMs only."""

    def all_reduce(self, x):
        return x


def tp_state(tp: int, rank: int) -> ParallelState:
    group = LocalGroup(tuple(range(tp)), rank)
    return ParallelState(Plan(tp=tp), rank, group, GroupHandle(), GroupHandle(), GroupHandle())


class Layer(nn.Module):
    """A decoder layer's four projections."""

    def __init__(self, cfg: dict):
        super().__init__()
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        d = cfg.get("head_dim") or h // heads
        self.qkv = QKVParallelLinear(h, d, heads, cfg["num_key_value_heads"])
        self.o = RowParallelLinear(heads * d, h)
        self.gate_up = MergedColumnParallelLinear(h, [cfg["intermediate_size"]] * 2)
        self.down = RowParallelLinear(cfg["intermediate_size"], h)


def build(cfg: dict, layers: int, tp: int, device, dtype) -> nn.ModuleList:
    """`layers` layers of one rank of TP=`tp` (rank 1 where there is one), random weights."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), use_state(tp_state(tp, min(1, tp - 1))):
            model = nn.ModuleList(Layer(cfg) for _ in range(layers))
    finally:
        torch.set_default_dtype(saved)
    for p in model.parameters():
        p.data.normal_(std=p.shape[-1] ** -0.5)
    return model


def step(model: nn.ModuleList, x: torch.Tensor, key: str, width: int):
    """One decode step's projections under the layout `key` (inputs of 1/width shard sizes)."""
    with use_context(StepContext(tp_state(width, min(1, width - 1)), key)):
        for layer in model:
            layer.qkv(x)
            layer.o(x.new_empty(x.shape[0], layer.o.weight.shape[1] // width))
            layer.gate_up(x)
            layer.down(x.new_empty(x.shape[0], layer.down.weight.shape[1] // width))


def time_ms(fn, device: torch.device, iters: int) -> float:
    """Median ms of `fn`; on CUDA replayed as one CUDA graph (as decode steps run)."""
    fn()
    if device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_needs(widths: list[int], mode: str) -> dict[str, Narrowing]:
    """The layouts of rank 1 of a node whose merges are `widths` (as the flying policy makes
    them on 4 GPUs: widths 2 and 4 on every rank)."""
    return {f"merge{w}.1": Narrowing(w, 1, mode) for w in widths}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--widths", type=int, nargs="+", default=[2, 4])
    p.add_argument("--layers", type=int, help="default: the shape's num_hidden_layers")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    cfg = json.load(open(args.model))
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cpu":
        torch.set_num_threads(1)  # a check of the script, not a measurement: keep it steady
    layers = args.layers or cfg["num_hidden_layers"]
    inputs = {b: torch.randn(b, cfg["hidden_size"], device=device, dtype=dtype)
              for b in args.batches}
    static = {}
    for w in args.widths:  # a rank of static TP=w: its shard only
        model = build(cfg, layers, w, device, dtype)
        time_ms(lambda: step(model, inputs[args.batches[-1]], BASE, 1), device, args.iters)  # warm-up
        for b, x in inputs.items():
            static[w, b] = time_ms(lambda: step(model, x, BASE, 1), device, args.iters)
        del model
    merged, permute_s, extra = {}, None, {}
    for mode in WEIGHT_MODES:
        replica = build(cfg, layers, 1, device, dtype)
        sync(device)
        start = time.perf_counter()
        extra[mode] = make_narrow_weights(replica, rank_needs(args.widths, mode), report=False)
        sync(device)
        if mode == "reorder":
            permute_s = time.perf_counter() - start
        for w in args.widths:
            for b, x in inputs.items():
                merged[mode, w, b] = time_ms(lambda: step(replica, x, f"merge{w}.1", w), device,
                                             args.iters)
        del replica
    report(cfg, layers, args, static, merged, permute_s, extra)


def report(cfg, layers, args, static, merged, permute_s, extra) -> None:
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"{args.model} ({layers} layers, {args.dtype}) on {device}: the linear layers of one "
          f"decode step on one rank; ratio = merged / static TP of the same width")
    rows = []
    for w in args.widths:
        for b in args.batches:
            row = {"width": w, "batch": b, "static_tp_ms": round(static[w, b], 4)}
            for mode in WEIGHT_MODES:
                row[f"{mode}_ms"] = round(merged[mode, w, b], 4)
                row[f"{mode}_ratio"] = round(merged[mode, w, b] / static[w, b], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"reorder_permute_s": round(permute_s, 4), "widths": args.widths,
                      "extra_gib": {m: round(n / 2**30, 3) for m, n in extra.items()}}))
    print("\n| width | batch | static TP ms | " + " | ".join(
        f"{m} ms (×TP)" for m in WEIGHT_MODES) + " |")
    print("|---|---|---|" + "---|" * len(WEIGHT_MODES))
    for row in rows:
        cells = [f"{row[f'{m}_ms']:.3f} ({row[f'{m}_ratio']:.2f}×)" for m in WEIGHT_MODES]
        print(f"| {row['width']} | {row['batch']} | {row['static_tp_ms']:.3f} | "
              + " | ".join(cells) + " |")
    print(f"\nreorder: one nested permutation for widths {args.widths} of a full replica's "
          f"{layers} layers at load: {permute_s * 1e3:.1f} ms; extra memory per rank: "
          + ", ".join(f"{m} {n / 2**30:.2f} GiB" for m, n in extra.items()))


if __name__ == "__main__":
    main()
