"""cuDNN's causal prompt attention by the memory layout of its inputs, and under a long
continuous load (issue 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/cudnn_layouts.py [--lengths 4096 16384 32768]
    [--sustained-s 3] [--output FILE]
32 query / 8 KV heads, head_dim 128, bf16, GQA in the call (as cudnn_prefill runs it). Per
length, ms (triton's do_bench) and TFLOP/s of the causal pairs for:
  - `engine`: q [n, heads, d] (the RoPE kernel's output) and K/V as views of a paged pool
    [blocks, 16, kv_heads, d], each transposed to [1, heads, n, d] (BSHD strides);
  - `q_heads_first`: q written [heads, n, d] (contiguous BHSD), K/V as `engine`; its
    output's copy back to [n, heads, d] timed apart (`to_rows_ms`);
  - `all_heads_first`: q, K and V contiguous BHSD;
  - `packed_noncausal`: no mask, a KV head's query heads packed as rows (cudnn_chunk's call
    before the cut), TFLOP/s of its n * n pairs;
  - `split_2`, `split_4`: the prompt as 2 / 4 chunks, each later one run as cudnn_chunk runs
    a chunk after a cached prefix (a causal prompt's work moved to unmasked calls).
`--sustained-s`: the engine layout at the longest length, then the 8B's gate_up GEMM of as
many rows, each called back to back for that long (as 32 layers of a long prompt's step
keep the GPU busy), each call timed by CUDA events: the first and last tenth's medians show
whether the GPU slows under the load."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, D, BLOCK = 32, 8, 128, 16


def causal_tflops(n: int, ms: float) -> float:
    return 4.0 * HEADS * D * n * (n + 1) / 2 / ms / 1e9


def attend(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=D ** -0.5,
                                              enable_gqa=True)


def inputs(n: int):
    gen = torch.Generator("cuda").manual_seed(n)
    rows = lambda heads: torch.randn(n, heads, D, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     generator=gen)
    pool = [torch.randn(n // BLOCK, BLOCK, KV_HEADS, D, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2)]
    q = rows(HEADS)
    k, v = (p.flatten(0, 1).transpose(0, 1).unsqueeze(0) for p in pool)
    return q, k, v


def by_layout(n: int) -> list[dict]:
    q, k, v = inputs(n)
    q_rows = q.transpose(0, 1).unsqueeze(0)
    q_heads = q.transpose(0, 1).contiguous().unsqueeze(0)
    k_heads, v_heads = k.contiguous(), v.contiguous()
    cases = {"engine": (q_rows, k, v), "q_heads_first": (q_heads, k, v),
             "all_heads_first": (q_heads, k_heads, v_heads)}
    reference = attend(*cases["engine"])
    rows = []
    for name, args in cases.items():
        out = attend(*args)
        ms = triton.testing.do_bench(lambda: attend(*args), warmup=5, rep=60)
        row = dict(n=n, layout=name, ms=round(ms, 4), tflops=round(causal_tflops(n, ms), 1),
                   out_strides=list(out.stride()),
                   max_abs_diff=float((out.float() - reference.float()).abs().max()))
        if name == "q_heads_first":
            row["to_rows_ms"] = round(triton.testing.do_bench(
                lambda: out[0].transpose(0, 1).contiguous(), warmup=5, rep=30), 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
    rows.append(packed_noncausal(q, k, v))
    for parts in (2, 4):
        rows.append(split_prompt(q, k, v, parts, reference[0].transpose(0, 1)))
    return rows


def split_prompt(q, k, v, parts: int, reference) -> dict:
    """The causal prompt as `parts` chunks: the first causal, each later one against the
    keys before it as cudnn_chunk's route runs a chunk after a cached prefix (no mask,
    packed; its own keys causally; the two merged)."""
    from parashift.attention import cudnn_chunk
    n = q.shape[0]
    size = n // parts
    k_rows, v_rows = (t[0].transpose(0, 1) for t in (k, v))  # [n, kv_heads, d] views

    def call():
        out = torch.empty_like(q)
        out[:size] = attend(q[:size].transpose(0, 1).unsqueeze(0), k[:, :, :size],
                            v[:, :, :size])[0].transpose(0, 1)
        for i in range(1, parts):
            rows = slice(i * size, (i + 1) * size)
            out[rows] = cudnn_chunk.chunk_attention(q[rows], k_rows[:rows.stop],
                                                    v_rows[:rows.stop], D ** -0.5)
        return out
    diff = float((call().float() - reference.float()).abs().max())
    ms = triton.testing.do_bench(call, warmup=3, rep=40)
    row = dict(n=n, layout=f"split_{parts}", ms=round(ms, 4),
               tflops=round(causal_tflops(n, ms), 1), max_abs_diff=diff)
    print(json.dumps(row), flush=True)
    return row


def packed_noncausal(q, k, v) -> dict:
    """Every query row against every key (no mask), a KV head's query heads packed as rows
    of one head (cudnn_chunk's call before the cut): the rate a causal prompt split into
    such blocks could reach."""
    n, group = q.shape[0], HEADS // KV_HEADS
    packed = q.view(n, KV_HEADS, group, D).permute(1, 0, 2, 3).reshape(1, KV_HEADS, n * group, D)

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(packed, k, v, scale=D ** -0.5)
    call()
    ms = triton.testing.do_bench(call, warmup=5, rep=60)
    row = dict(n=n, layout="packed_noncausal", ms=round(ms, 4),
               tflops=round(4.0 * HEADS * D * n * n / ms / 1e9, 1))
    print(json.dumps(row), flush=True)
    return row


def sustained(n: int, seconds: float, what: str) -> dict:
    """`what`: attention (the engine layout) or gate_up (the 8B's [n, 4096] x [4096, 28672]
    GEMM), called back to back for `seconds`."""
    if what == "attention":
        q, k, v = inputs(n)
        args = (q.transpose(0, 1).unsqueeze(0), k, v)
        call = lambda: attend(*args)  # noqa: E731
    else:
        x = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16) / 64
        call = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    call()
    torch.cuda.synchronize()
    one = triton.testing.do_bench(call, warmup=2, rep=20)
    calls = max(20, int(seconds * 1e3 / one))
    time.sleep(1.0)  # the GPU idle first, as before a prompt's step
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    events[0].record()
    for i in range(calls):
        call()
        events[i + 1].record()
    torch.cuda.synchronize()
    ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    tenth = max(1, calls // 10)
    first, last = statistics.median(ms[:tenth]), statistics.median(ms[-tenth:])
    flops_ms = causal_tflops(n, 1.0) if what == "attention" else 2 * n * 4096 * 28672 / 1e9
    row = dict(what=what, n=n, calls=calls, do_bench_ms=round(one, 4),
               first_tenth_ms=round(first, 4), last_tenth_ms=round(last, 4),
               last_over_first=round(last / first, 4),
               first_tflops=round(flops_ms / first, 1), last_tflops=round(flops_ms / last, 1))
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--sustained-s", type=float, default=0.0)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if any(n % BLOCK for n in args.lengths):
        raise SystemExit(f"lengths must be multiples of {BLOCK}")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  rows=[r for n in args.lengths for r in by_layout(n)])
    if args.sustained_s > 0:
        result["sustained"] = [sustained(max(args.lengths), args.sustained_s, what)
                               for what in ("attention", "gate_up")]
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
