"""Decode attention as a CUDA-graph step runs it, µs a layer: the one-launch kernel
(PARASHIFT_ATTN_FUSED_REDUCE=1) against the split kernel and its reduction launch (=0), and
at more than 8 splits the preloading split kernel (PARASHIFT_ATTN_PRELOAD=1) against the
split kernel (=0), PDL off and on, over batches and contexts, on a model shape's heads (the
launch before each is the previous layer's attention: no RoPE inside, nothing written).

The metadata is a graph's: captured for --graph-len tokens (its split count chosen for that,
as cuda_graphs.py's for max_model_len), replayed at the row's context. Each timed replay
walks the layers' own KV pools in turn (enough of them to leave the L2 cache behind), so a
layer reads its KV from HBM as in a model's step. KV GB/s and the fraction of the copy
bandwidth (read + write of a large copy, as decode_throughput.py's floor) beside each.

--configs: the one-launch kernel's KV tile, warps, stages and split count at large batches
(the rows named by --config-cells) instead; --split-tokens: its tokens per split at batch 1
(the one-launch kernel at any split count).

Usage (GPU): python3 benchmarks/decode_attention_sweep.py --model benchmarks/shapes/llama-3.1-8b.json \
    --batches 1 8 64 256 --contexts 1024 4096 8192 32768 [--configs] [--split-tokens] \
    [--output rows.json]"""
import argparse
import itertools
import json
import math
import os

import torch
import triton.testing

from parashift.attention import triton_backend
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.triton_backend import KernelConfig, TritonAttentionBackend
from parashift.cost.measure_kernels import paged_step

L2_FLUSH_BYTES = 256 << 20
# (PARASHIFT_ATTN_FUSED_REDUCE, PARASHIFT_ATTN_PRELOAD): the split kernel over every split and
# its reduction; with each row's splits from its context (more than 8 splits; at most 8: the
# one-launch kernel); the same in the preloading split kernel (triton_decode_preload.py)
LAUNCH_VARIANTS = (("0", "0"), ("1", "0"), ("1", "1"))
MAX_LAYERS = 64
MAX_TOKENS = 1 << 20  # batch x context of one row at most (the pools' memory)


def graph_metadata(meta: AttentionMetadata, graph_len: int) -> AttentionMetadata:
    """`meta` as a decode graph captured for graph_len tokens holds it."""
    rows = meta.num_seqs
    return AttentionMetadata(**{**meta.__dict__, "query_start_loc_cpu": list(range(rows + 1)),
                                "seq_lens_cpu": [graph_len] * rows, "max_seq_len": graph_len,
                                "static_shape": True})


class Layers:
    """A decode step's q over `layers` KV pools of one shape (the same block tables)."""

    def __init__(self, cfg: dict, batch: int, context: int, graph_len: int, kv_dtype):
        heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        self.kv_bytes = 2 * batch * context * kv_heads * self.head_dim * kv_dtype.itemsize
        count = min(MAX_LAYERS, max(2, math.ceil(L2_FLUSH_BYTES / self.kv_bytes)))
        q, k, v, meta = paged_step(torch.device("cuda"), torch.bfloat16, heads, kv_heads,
                                   self.head_dim, [1] * batch, [context] * batch, 16,
                                   shuffled=True)
        self.q, self.meta = q, graph_metadata(meta, graph_len)
        self.pools = [(k.to(kv_dtype), v.to(kv_dtype))]
        for _ in range(count - 1):
            self.pools.append((torch.randn_like(k, dtype=torch.bfloat16).to(kv_dtype),
                               torch.randn_like(v, dtype=torch.bfloat16).to(kv_dtype)))

    def step_us(self, backend) -> tuple[float, torch.Tensor]:
        """µs a layer of a graph replaying every layer's attend; the first layer's output."""
        scale = self.head_dim ** -0.5

        def step():
            return [backend.attend(self.q, k, v, self.meta, scale) for k, v in self.pools]

        out = step()[0]
        torch.cuda.synchronize()
        ms = triton.testing.do_bench_cudagraph(step, rep=60)
        return ms * 1e3 / len(self.pools), out


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (triton.testing.do_bench(lambda: dst.copy_(src), rep=100) * 1e-3)


def with_env(**values):
    """Sets the environment variables, returning their old values to restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return old


def restore(old: dict) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def row(layers: Layers, us: float, bandwidth: float, **fields) -> dict:
    rate = layers.kv_bytes / (us * 1e-6)
    return {**fields, "us_per_layer": round(us, 2), "kv_tb_s": round(rate / 1e12, 3),
            "of_copy_bw": round(rate / bandwidth, 3)}


def sweep(cfg, args, bandwidth) -> list[dict]:
    rows = []
    for batch, context in itertools.product(args.batches, args.contexts):
        if batch * context > MAX_TOKENS:
            continue
        layers = Layers(cfg, batch, context, max(args.graph_len, context), args.kv_dtype)
        reference = None
        launches = [v for v in LAUNCH_VARIANTS if "".join(v) in args.launches]
        for pdl, (fused, preload), pairs in itertools.product(args.pdl, launches,
                                                               args.fp8_pairs):
            old = with_env(PARASHIFT_PDL=pdl, PARASHIFT_ATTN_FUSED_REDUCE=fused,
                           PARASHIFT_ATTN_PRELOAD=preload, PARASHIFT_ATTN_FP8_PAIRS=pairs)
            try:
                us, out = layers.step_us(TritonAttentionBackend())
            finally:
                restore(old)
            reference = out if reference is None else reference
            r = row(layers, us, bandwidth, batch=batch, context=context, pdl=int(pdl),
                    fused=int(fused), preload=int(preload), fp8_pairs=int(pairs),
                    max_diff=(out.float() - reference.float()).abs().max().item())
            rows.append(r)
            print(json.dumps(r), flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


def patched(name: str, value):
    original = getattr(triton_backend, name)
    setattr(triton_backend, name, value)
    return original


def config_sweep(cfg, args, bandwidth) -> list[dict]:
    rows = []
    # (KV tile, warps, stages, grid with the KV heads first); session 44's first call had
    # (64, 4, 3 or 2), (32, 4, 3 or 4), (16, 4, 4), (32, 2, 3), and heads first (no change)
    configs = [(64, 4, 2, False), (64, 4, 1, False), (64, 8, 2, False), (64, 2, 2, False),
               (128, 4, 2, False), (128, 8, 2, False), (128, 8, 1, False)]
    block_m = max(16, triton_backend.triton.next_power_of_2(
        cfg["num_attention_heads"] // cfg["num_key_value_heads"]))
    for cell in args.config_cells:
        batch, context = map(int, cell.split("x"))
        layers = Layers(cfg, batch, context, max(args.graph_len, context), args.kv_dtype)
        for (n, w, s, heads_first), splits in itertools.product(configs, args.config_splits):
            config = KernelConfig(block_m, n, w, s)
            saved = (patched("fused_decode_config", lambda *a, c=config: c),
                     patched("choose_num_splits", lambda *a, k=splits: k),
                     patched("FUSED_HEADS_FIRST", heads_first),
                     patched("FUSED_UNSPLIT_PROGRAMS_PER_SM", 1 << 30))
            fields = dict(batch=batch, context=context, tile_n=n, warps=w, stages=s,
                          splits=splits, heads_first=heads_first)
            try:
                us, _ = layers.step_us(TritonAttentionBackend())
                r = row(layers, us, bandwidth, **fields)
            except Exception as exc:  # out of resources and the like
                r = {**fields, "failed": type(exc).__name__}
            finally:
                for name, value in zip(("fused_decode_config", "choose_num_splits",
                                        "FUSED_HEADS_FIRST", "FUSED_UNSPLIT_PROGRAMS_PER_SM"),
                                       saved):
                    patched(name, value)
            rows.append(r)
            print(json.dumps(r), flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


def split_tokens_sweep(cfg, args, bandwidth) -> list[dict]:
    rows = []
    for context in args.contexts:
        layers = Layers(cfg, 1, context, max(args.graph_len, context), args.kv_dtype)
        for tokens in (64, 128, 256):
            saved = (patched("FUSED_SPLIT_TOKENS", tokens),
                     patched("FUSED_MAX_SPLITS", triton_backend.MAX_SPLITS))
            try:
                us, _ = layers.step_us(TritonAttentionBackend())
            finally:
                for name, value in zip(("FUSED_SPLIT_TOKENS", "FUSED_MAX_SPLITS"), saved):
                    patched(name, value)
            r = row(layers, us, bandwidth, batch=1, context=context, split_tokens=tokens)
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    p.add_argument("--graph-len", type=int, default=8192,
                   help="the graph's max_model_len (at least the row's context; 0: the context)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument("--configs", action="store_true")
    p.add_argument("--config-cells", nargs="+", default=["64x1024", "256x1024", "64x4096"])
    p.add_argument("--config-splits", type=int, nargs="+", default=[1])
    p.add_argument("--pdl", nargs="+", choices=("0", "1"), default=["0", "1"],
                   help="PARASHIFT_PDL settings of the sweep")
    p.add_argument("--split-tokens", action="store_true")
    p.add_argument("--launches", nargs="+", choices=["".join(v) for v in LAUNCH_VARIANTS],
                   default=["".join(v) for v in LAUNCH_VARIANTS],
                   help="the launch variants timed (PARASHIFT_ATTN_FUSED_REDUCE and "
                        "PARASHIFT_ATTN_PRELOAD, e.g. 11)")
    p.add_argument("--fp8-pairs", nargs="+", choices=("0", "1"), default=["0"],
                   help="PARASHIFT_ATTN_FP8_PAIRS settings (an FP8 pool's values as pairs)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    args.kv_dtype = torch.float8_e4m3fn if args.kv_cache_dtype == "fp8" else torch.bfloat16
    cfg = json.load(open(args.model))
    bandwidth = copy_bandwidth()
    print(json.dumps({"copy_bandwidth_tb_s": round(bandwidth / 1e12, 3)}), flush=True)
    if args.configs:
        rows = config_sweep(cfg, args, bandwidth)
    elif args.split_tokens:
        rows = split_tokens_sweep(cfg, args, bandwidth)
    else:
        rows = sweep(cfg, args, bandwidth)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(),
                       "kv_cache_dtype": args.kv_cache_dtype, "graph_len": args.graph_len,
                       "copy_bandwidth_tb_s": bandwidth / 1e12, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
