"""Decode attention at 64-256 rows against the KV bandwidth: the one-launch kernel
(triton_decode.py) in its variants (over an FP8 pool its values read as pairs,
triton_fp8_values.py, and the KV tile) against kernels that only read the same bytes (the
ceilings), µs a layer in CUDA graphs over the engine's paged layout (block 16, shuffled
pages), each layer its own KV pool (decode_attention_sweep.Layers: the L2 cache left behind).

Ceilings: "read-paged" streams each (row, KV head)'s K and V tiles through its block table as
the attention's grid does (a program a (row, KV head), 64-token tiles, the sum of the values
stored), "read-blocks-S" a whole pool block at a time (every KV head's rows of its 16 tokens:
contiguous), a row's blocks cut in S, "read-flat" streams a contiguous buffer of the same
bytes (read_ceiling.py's kernel, 8 rows of 16 KB a program). --chain: each layer as the
engine runs it (attention/rotate_attend.py: the rotary kernel writing q and the new token's K
and V, then attention; PDL as the engine launches).

Session 47's first call also timed a stream-K kernel (programs sharing the launch's KV tiles
evenly, cut units merged by ticket) and the preloading kernel at these batches: both slower,
removed (docs/benchmark_log.md, helper attn64); so was its one masked tile loop (session 46).

Usage (GPU): python3 benchmarks/decode_attention_ceiling.py --cells 64x1040 256x1040 \
    [--graph-len 2048] [--variants fused fp8-pairs ...] [--chain] [--kv-cache-dtype fp8] \
    [--output rows.json]"""
import argparse
import json

import torch
import triton
import triton.language as tl
import triton.testing

from benchmarks import read_ceiling
from benchmarks.decode_attention_sweep import (Layers, copy_bandwidth, patched, restore, row,
                                              with_env)
from parashift.attention import triton_backend
from parashift.attention.triton_backend import KernelConfig, TritonAttentionBackend
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.rotate_attend import rotate_write_attend

PAIRS = {"PARASHIFT_ATTN_FP8_PAIRS": "1"}
# name: (environment, triton_backend's names patched: the one-launch kernel's config as (KV
# tile, warps, stages))
VARIANTS = {
    "fused": ({"PARASHIFT_ATTN_FP8_PAIRS": "0"}, {}),  # the pairs' switch off (bf16: no matter)
    "fp8-pairs": (PAIRS, {}),
    "fp8-pairs-f16": ({**PAIRS, "PARASHIFT_ATTN_FP8_F16": "1"}, {}),
    "fp8-pairs-s2": (PAIRS, {"fused_decode_config": (64, 4, 2)}),
    "fp8-pairs-s4": (PAIRS, {"fused_decode_config": (64, 4, 4)}),
    "fp8-pairs-t128": (PAIRS, {"fused_decode_config": (128, 4, 2)}),
    "fp8-pairs-t128-s3": (PAIRS, {"fused_decode_config": (128, 4, 3)}),
    "fp8-pairs-t128-w8": (PAIRS, {"fused_decode_config": (128, 8, 2)}),
    "fp8-pairs-s3": (PAIRS, {"fused_decode_config": (64, 4, 3)}),
    "fused-s3": ({"PARASHIFT_ATTN_FP8_PAIRS": "0"}, {"fused_decode_config": (64, 4, 3)}),
}
CEILINGS = ("read-paged", "read-flat", "read-blocks-8")
FLAT_ROW = 16384  # bytes: read_ceiling.py's 1 GiB shape's rows (its best: 8 rows a program)


@triton.jit
def _read_paged_kernel(out_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                       stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                       stride_bt, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                       HEAD_DIM: tl.constexpr, STAGES: tl.constexpr):
    """Sums (row, KV head)'s context's K and V: the attention's loads, no attention."""
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + i)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    table = block_tables_ptr + i.to(tl.int64) * stride_bt
    total = tl.zeros([TILE_N, HEAD_DIM], dtype=tl.float32)
    for t in tl.range(0, tl.cdiv(seq_len, TILE_N), num_stages=STAGES):
        pos = t * TILE_N + offs_n
        ok = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        in_block = pos % BLOCK_SIZE
        k = tl.load((k_cache_ptr + kv_head * stride_kh + block * stride_kb
                     + in_block * stride_ks)[:, None] + offs_d[None, :], mask=ok[:, None],
                    other=0.0)
        v = tl.load((v_cache_ptr + kv_head * stride_vh + block * stride_vb
                     + in_block * stride_vs)[:, None] + offs_d[None, :], mask=ok[:, None],
                    other=0.0)
        total += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + i * tl.num_programs(1) + kv_head, tl.sum(tl.sum(total, 1), 0))


@triton.jit
def _read_blocks_kernel(out_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                        stride_kb, stride_ks, stride_vb, stride_vs, stride_bt,
                        BLOCK_SIZE: tl.constexpr, ROW: tl.constexpr, STAGES: tl.constexpr):
    """Sums a row's share of its context's K and V a whole block at a time (every KV head's
    rows: BLOCK_SIZE x ROW contiguous elements), the row's context cut among the grid's
    second axis."""
    i = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + i)
    blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    per_split = tl.cdiv(blocks, splits)
    offs_s = tl.arange(0, BLOCK_SIZE)
    offs_r = tl.arange(0, ROW)
    table = block_tables_ptr + i.to(tl.int64) * stride_bt
    total = tl.zeros([BLOCK_SIZE, ROW], dtype=tl.float32)
    for b in tl.range(split * per_split, tl.minimum(blocks, (split + 1) * per_split),
                      num_stages=STAGES):
        block = tl.load(table + b).to(tl.int64)
        ok = (b * BLOCK_SIZE + offs_s < seq_len)[:, None]
        k = tl.load(k_cache_ptr + block * stride_kb + offs_s[:, None] * stride_ks
                    + offs_r[None, :], mask=ok, other=0.0)
        v = tl.load(v_cache_ptr + block * stride_vb + offs_s[:, None] * stride_vs
                    + offs_r[None, :], mask=ok, other=0.0)
        total += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + i * splits + split, tl.sum(tl.sum(total, 1), 0))


def read_blocks(layers: Layers, k, v, out, splits: int) -> None:
    meta = layers.meta
    _read_blocks_kernel[(len(layers.q), splits)](
        out, k, v, meta.block_tables, meta.seq_lens, k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), meta.block_tables.stride(0), BLOCK_SIZE=k.shape[1],
        ROW=k.shape[2] * k.shape[3], STAGES=2, num_warps=8)


def read_paged(layers: Layers, k, v, out) -> None:
    meta = layers.meta
    _read_paged_kernel[(len(layers.q), k.shape[2])](
        out, k, v, meta.block_tables, meta.seq_lens, *k.stride()[:3], *v.stride()[:3],
        meta.block_tables.stride(0), TILE_N=64, BLOCK_SIZE=k.shape[1], HEAD_DIM=k.shape[3],
        STAGES=2, num_warps=4)


def graph_us(layers: Layers, per_layer) -> float:
    def step():
        return [per_layer(k, v) for k, v in layers.pools]

    step()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(step, rep=60) * 1e3 / len(layers.pools)


def ceiling_us(layers: Layers, name: str) -> float:
    if name == "read-paged":
        out = torch.empty(len(layers.q) * layers.pools[0][0].shape[2], device="cuda")
        return graph_us(layers, lambda k, v: read_paged(layers, k, v, out))
    if name.startswith("read-blocks"):  # read-blocks-S: S splits a row
        splits = int(name.rsplit("-", 1)[1])
        out = torch.empty(len(layers.q) * splits, device="cuda")
        return graph_us(layers, lambda k, v: read_blocks(layers, k, v, out, splits))
    flat = [torch.randint(0, 255, (layers.kv_bytes // FLAT_ROW, FLAT_ROW), dtype=torch.uint8,
                          device="cuda") for _ in layers.pools]
    out = torch.empty(len(flat[0]), dtype=torch.uint8, device="cuda")
    pools, layers.pools = layers.pools, [(w, None) for w in flat]
    try:
        return graph_us(layers, lambda w, _: read_ceiling.read(w, out, "regs", 8, 2048, 8, 1))
    finally:
        layers.pools = pools


class Chain:
    """Each layer as the engine runs it (attention/rotate_attend.py): the rotary kernel
    writing q and the new token's K and V, then attention; or both in one launch where the
    plan takes the preloading kernel."""

    def __init__(self, layers: Layers):
        q, meta = layers.q, layers.meta
        rows, heads, head_dim = q.shape
        kv_heads = layers.pools[0][0].shape[2]
        self.positions = (meta.seq_lens.long() - 1).clamp(min=0)
        last = self.positions
        block = meta.block_tables.gather(1, (last // meta.block_size)[:, None])[:, 0].long()
        self.meta = AttentionMetadata(**{**meta.__dict__,
                                         "slot_mapping": block * meta.block_size
                                         + last % meta.block_size})
        self.k = torch.randn(rows, kv_heads, head_dim, device="cuda", dtype=q.dtype)
        self.v = torch.randn_like(self.k)
        angles = torch.rand(int(self.positions.max()) + 1, head_dim // 2, device="cuda")
        self.cos_sin = torch.cat((angles.cos(), angles.sin()), 1)

    def attend(self, layers: Layers, backend, k_cache, v_cache):
        return rotate_write_attend(backend, self.positions, layers.q, self.k, self.v,
                                   self.cos_sin, k_cache, v_cache, self.meta,
                                   layers.head_dim ** -0.5)


def variant_us(layers: Layers, name: str, chain: "Chain | None") -> tuple[float, torch.Tensor]:
    env, patches = VARIANTS[name]
    old = with_env(**env)
    saved = {}
    for attr, value in patches.items():
        if attr == "fused_decode_config":
            block_m = triton_backend.decode_config(layers.head_dim, 4, 2).block_m
            value = lambda *a, c=KernelConfig(block_m, *value): c  # noqa: E731
        saved[attr] = patched(attr, value)
    try:
        backend = TritonAttentionBackend()
        if chain is None:
            return layers.step_us(backend)
        first = chain.attend(layers, backend, *layers.pools[0])
        return graph_us(layers, lambda k, v: chain.attend(layers, backend, k, v)), first
    finally:
        restore(old)
        for attr, value in saved.items():
            patched(attr, value)


def kernel_resources() -> list[dict]:
    """Registers and shared memory of the decode kernels compiled so far."""
    from parashift.attention import triton_decode
    found = []
    for name, fn in (("fused", triton_decode.decode_attention_kernel),
                     ("read-paged", _read_paged_kernel)):
        try:
            for cache in fn.device_caches.values():
                for kernel in cache[0].values():
                    found.append(dict(kernel=name, n_regs=kernel.n_regs,
                                      shared=kernel.metadata.shared,
                                      warps=kernel.metadata.num_warps,
                                      stages=kernel.metadata.num_stages))
        except Exception as exc:  # the cache's layout differs between Triton versions
            found.append(dict(kernel=name, failed=repr(exc)[:200]))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--cells", nargs="+", default=["64x1040", "256x1040"])
    p.add_argument("--graph-len", type=int, default=2048)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS) + list(CEILINGS),
                   choices=list(VARIANTS) + list(CEILINGS))
    p.add_argument("--chain", action="store_true")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    kv_dtype = torch.float8_e4m3fn if args.kv_cache_dtype == "fp8" else torch.bfloat16
    cfg = json.load(open(args.model))
    bandwidth = copy_bandwidth()
    print(json.dumps({"copy_bandwidth_tb_s": round(bandwidth / 1e12, 3)}), flush=True)
    rows = []
    for cell in args.cells:
        batch, context = map(int, cell.split("x"))
        layers = Layers(cfg, batch, context, max(args.graph_len, context), kv_dtype)
        chain = Chain(layers) if args.chain else None
        reference = None
        for name in args.variants:
            fields = dict(batch=batch, context=context, variant=name, chain=args.chain,
                          kv_cache_dtype=args.kv_cache_dtype)
            try:
                if name in CEILINGS:
                    r = row(layers, ceiling_us(layers, name), bandwidth, **fields)
                else:
                    us, out = variant_us(layers, name, chain)
                    reference = out if reference is None else reference
                    r = row(layers, us, bandwidth, **fields,
                            max_diff=(out.float() - reference.float()).abs().max().item())
            except Exception as exc:  # out of resources and the like
                r = {**fields, "failed": repr(exc)[:300]}
            rows.append(r)
            print(json.dumps(r), flush=True)
        del layers, chain
        torch.cuda.empty_cache()
    resources = kernel_resources()
    print(json.dumps({"resources": resources}), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(),
                       "graph_len": args.graph_len, "copy_bandwidth_tb_s": bandwidth / 1e12,
                       "rows": rows, "resources": resources}, f, indent=1)


if __name__ == "__main__":
    main()
