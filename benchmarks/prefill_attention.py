"""Prefill attention backends side by side on one GPU (issue 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/prefill_attention.py [--cases Q:PREFIX,..]
    [--backends NAME,..] [--rounds N] [--output FILE]
One long sequence (32 query / 8 KV heads, head_dim 128, bf16, paged KV of 16-token blocks),
causal, with and without a cached prefix; each backend in TFLOP/s of the causal pairs it
must compute and as a fraction of the matrix peak: the Triton kernel over the paged pool,
and PyTorch's SDPA (cuDNN, flash) over the context gathered from the pool (the gather
counted in its time)."""
import argparse
import dataclasses
import json
import statistics

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from parashift.attention.cudnn_prefill import CudnnPrefillAttentionBackend
from parashift.attention.triton_backend import TritonAttentionBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
PEAK_TFLOPS = 989.0  # H200 dense bf16 (../shared/workloads.md)


def make_case(q_len: int, prefix: int):
    import benchmarks.attention_kernels as ak
    return ak.make_step([q_len], [prefix + q_len])


def causal_flops(q_len: int, prefix: int) -> float:
    pairs = q_len * prefix + q_len * (q_len + 1) / 2
    return 4.0 * NUM_HEADS * HEAD_DIM * pairs


def gather_context(cache, table, seq_len):
    blocks = cache[table[: -(-seq_len // BLOCK_SIZE)]]
    return blocks.flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D]


def sdpa_variant(backend, q, k_cache, v_cache, meta, gqa: str, lower_right: bool):
    q_len, seq_len = q.shape[0], meta.seq_lens_cpu[0]
    table = meta.block_tables[0]
    scale = HEAD_DIM ** -0.5

    def run():
        k = gather_context(k_cache, table, seq_len)
        v = gather_context(v_cache, table, seq_len)
        if gqa == "expand":
            k = k.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
            v = v.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
        qq = q.transpose(0, 1).unsqueeze(0)
        kwargs = {"enable_gqa": True} if gqa == "native" else {}
        if q_len == seq_len:
            kwargs["is_causal"] = True
        elif lower_right:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(q_len, seq_len)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qq, k, v, scale=scale, **kwargs)[0].transpose(0, 1)
    return run


def cudnn_with_lse(q, k, v, causal: bool, scale: float):
    """q, k, v: [1, heads, len, d] (equal head counts) -> (out, natural-log LSE [1, heads, len])."""
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(out.shape[:3])


def split_prefix_variant(q, k_cache, v_cache, meta):
    """A chunk against a cached prefix in two cuDNN calls merged by their LSE: every query
    row against the prefix (no mask; a KV head's query heads packed as rows), then the chunk
    causally against itself."""
    q_len, seq_len = q.shape[0], meta.seq_lens_cpu[0]
    prefix, group = seq_len - q_len, NUM_HEADS // NUM_KV_HEADS
    table, scale = meta.block_tables[0], HEAD_DIM ** -0.5

    def run():
        k = gather_context(k_cache, table, seq_len)
        v = gather_context(v_cache, table, seq_len)
        packed = q.view(q_len, NUM_KV_HEADS, group, HEAD_DIM).permute(1, 0, 2, 3)
        packed = packed.reshape(1, NUM_KV_HEADS, q_len * group, HEAD_DIM)
        out_a, lse_a = cudnn_with_lse(packed, k[:, :, :prefix], v[:, :, :prefix], False, scale)
        out_a = out_a.view(NUM_KV_HEADS, q_len, group, HEAD_DIM).permute(1, 0, 2, 3)
        lse_a = lse_a.view(NUM_KV_HEADS, q_len, group).permute(1, 0, 2)
        kc = k[:, :, prefix:].repeat_interleave(group, dim=1)
        vc = v[:, :, prefix:].repeat_interleave(group, dim=1)
        out_b, lse_b = cudnn_with_lse(q.transpose(0, 1).unsqueeze(0), kc, vc, True, scale)
        out_b = out_b[0].transpose(0, 1).view(q_len, NUM_KV_HEADS, group, HEAD_DIM)
        lse_b = lse_b[0].transpose(0, 1).view(q_len, NUM_KV_HEADS, group)
        lse = torch.logaddexp(lse_a, lse_b)
        out = (out_a.float() * (lse_a - lse).exp().unsqueeze(-1)
               + out_b.float() * (lse_b - lse).exp().unsqueeze(-1))
        return out.to(q.dtype).reshape(q_len, NUM_HEADS, HEAD_DIM)
    return run


def chunk_switched(fn, merge: bool, gqa: bool):
    """fn with cudnn_chunk's merge kernel and GQA in its causal call set as given."""
    from parashift.attention import cudnn_chunk

    def run():
        saved = cudnn_chunk.FUSED_MERGE, cudnn_chunk.NATIVE_GQA
        cudnn_chunk.FUSED_MERGE, cudnn_chunk.NATIVE_GQA = merge, gqa
        try:
            return fn()
        finally:
            cudnn_chunk.FUSED_MERGE, cudnn_chunk.NATIVE_GQA = saved
    return run


def time_variant(row: dict, fn, ref) -> None:
    """Adds one do_bench of fn to row["ms_rounds"] (and its output's difference from ref the
    first time), or the error a backend refusing the case raised."""
    try:
        if "max_abs_diff_vs_triton" not in row:
            out = fn()
            torch.cuda.synchronize()
            row["max_abs_diff_vs_triton"] = float((out.float() - ref.float()).abs().max())
        row["ms_rounds"].append(round(triton.testing.do_bench(fn, warmup=5, rep=50), 4))
    except Exception as e:  # noqa: BLE001 -- a backend that refuses a case is a result
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default=None, help="comma-separated names; default: all")
    p.add_argument("--cases", default="1024:0,2048:0,4096:0,8192:0,16384:0,32768:0,8192:8192,8192:24576,2048:30720")
    p.add_argument("--rounds", type=int, default=1,
                   help="each variant timed this many times, the order rotated each round "
                        "(a GPU under its power cap slows the later ones); the median")
    p.add_argument("--output", default=None)
    p.add_argument("--first-calls", action="store_true", help="cuDNN's per-shape build cost")
    args = p.parse_args()
    if args.first_calls:
        first_call_costs()
    rows = []
    for case in args.cases.split(","):
        q_len, prefix = map(int, case.split(":"))
        q, k_cache, v_cache, meta = make_case(q_len, prefix)
        flops = causal_flops(q_len, prefix)
        triton_be, cudnn_be = TritonAttentionBackend(), CudnnPrefillAttentionBackend()
        ref = triton_be.attend(q, k_cache, v_cache, meta, HEAD_DIM ** -0.5)
        variants = {"triton_paged": lambda: triton_be.attend(q, k_cache, v_cache, meta,
                                                               HEAD_DIM ** -0.5)}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("flash", SDPBackend.FLASH_ATTENTION)):
            for gqa in ("native", "expand"):
                variants[f"sdpa_{name}_{gqa}"] = sdpa_variant(be, q, k_cache, v_cache, meta,
                                                              gqa, lower_right=True)
        if prefix:
            variants["cudnn_split_lse"] = split_prefix_variant(q, k_cache, v_cache, meta)
        variants["cudnn_backend"] = lambda: cudnn_be.attend(q, k_cache, v_cache, meta,
                                                            HEAD_DIM ** -0.5)
        if prefix:  # the chunk route at any chunk and context (the defaults: 2048, 8192)
            forced, own = (CudnnPrefillAttentionBackend(chunk_tokens=1, chunk_context=1),
                           dataclasses.replace(meta, derived={}))  # its own routes cached
            variants["cudnn_chunk_forced"] = lambda: forced.attend(q, k_cache, v_cache, own,
                                                                   HEAD_DIM ** -0.5)
            for merge, gqa in ((False, False), (True, False), (False, True)):  # parts apart
                variants[f"cudnn_chunk_merge{int(merge)}_gqa{int(gqa)}"] = chunk_switched(
                    variants["cudnn_chunk_forced"], merge, gqa)
        chosen = [n for n in variants if not args.backends or n in args.backends.split(",")]
        by_name = {}
        for round_ in range(args.rounds):  # each round's order rotated: none always first
            for name in chosen[round_ % len(chosen):] + chosen[:round_ % len(chosen)]:
                row = by_name.setdefault(name, {"q_len": q_len, "prefix": prefix,
                                                "backend": name, "ms_rounds": []})
                if "error" not in row:
                    time_variant(row, variants[name], ref)
        for row in by_name.values():
            if "error" not in row:
                ms = statistics.median(row["ms_rounds"])
                row.update(ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1),
                           of_peak=round(flops / ms / 1e9 / PEAK_TFLOPS, 3))
            print(json.dumps(row), flush=True)
            rows.append(row)
        del q, k_cache, v_cache
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)




def first_call_costs(lengths=(3000, 3001, 3002, 5000, 3000)):
    """Milliseconds of cuDNN SDPA's first call at each new length (its graph is built per
    shape) beside a repeated call."""
    for n in lengths:
        q = torch.randn(1, NUM_HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, NUM_KV_HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            import time
            t0 = time.perf_counter()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
            torch.cuda.synchronize()
            times.append(round((time.perf_counter() - t0) * 1e3, 2))
        print(json.dumps({"first_call_len": n, "first_ms": times[0], "again_ms": times[1]}))


if __name__ == "__main__":
    main()
