"""Microbenchmark of the Triton attention kernels over a paged KV pool.

Usage (GPU): PYTHONPATH=. python3 benchmarks/attention_kernels.py [--sweep]
Decode: time of one `attend` (CUDA graph replay, so launch overhead is left
out) and the KV bytes it reads per second. Prefill: one causal sequence, in
TFLOP/s, beside torch SDPA (dense, not paged) on the same shapes. --sweep
also times other kernel configs."""
import argparse

import torch
import torch.nn.functional as F
import triton
import triton.testing

from parashift.attention import triton_backend
from parashift.attention.triton_backend import KernelConfig, TritonAttentionBackend
from parashift.cost.measure_kernels import paged_step

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16


def make_step(q_lens, seq_lens):
    """q, pools and metadata; block tables are a random permutation of the pool."""
    return paged_step(torch.device("cuda"), DTYPE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, q_lens,
                      seq_lens, BLOCK_SIZE, shuffled=True)


def time_attend(q, k_cache, v_cache, meta, invariant: bool = False) -> float:
    """Milliseconds per call, replayed from a CUDA graph."""
    return time_and_output(q, k_cache, v_cache, meta, invariant)[0]


def time_and_output(q, k_cache, v_cache, meta, invariant: bool):
    """(milliseconds per call replayed from a CUDA graph, the output)."""
    backend = TritonAttentionBackend(batch_invariant=invariant)
    scale = HEAD_DIM ** -0.5
    fn = lambda: backend.attend(q, k_cache, v_cache, meta, scale)  # noqa: E731
    out = fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=100), out


def copy_bandwidth() -> float:
    """Bytes read plus written per second by a large device-to-device copy."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms * 1e-3)


def bench_decode(batch: int, context: int) -> str:
    q, k_cache, v_cache, meta = make_step([1] * batch, [context] * batch)
    ms = time_attend(q, k_cache, v_cache, meta)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * q.element_size()
    return (f"decode batch {batch:4d} ctx {context:6d}: {ms * 1e3:8.1f} us  "
            f"KV read {kv_bytes / (ms * 1e-3) / 1e12:5.2f} TB/s")


def bench_prefill(tokens: int) -> str:
    q, k_cache, v_cache, meta = make_step([tokens], [tokens])
    ms = time_attend(q, k_cache, v_cache, meta)
    flops = 4 * NUM_HEADS * HEAD_DIM * tokens * (tokens + 1) / 2
    q_d = q.transpose(0, 1).unsqueeze(0)
    kv_d = torch.randn(1, NUM_KV_HEADS, tokens, HEAD_DIM, device="cuda", dtype=DTYPE)
    sdpa = lambda: F.scaled_dot_product_attention(  # noqa: E731
        q_d, kv_d, kv_d, is_causal=True, enable_gqa=True)
    sdpa_ms = triton.testing.do_bench_cudagraph(sdpa, rep=100)
    return (f"prefill {tokens} tokens: {ms * 1e3:8.1f} us  {flops / (ms * 1e-3) / 1e12:6.1f} "
            f"TFLOP/s  (torch SDPA dense: {flops / (sdpa_ms * 1e-3) / 1e12:6.1f} TFLOP/s)")


def bench_mixed(chunk: int, cached: int, decodes: int, decode_ctx: int,
                decodes_first: bool) -> str:
    q_lens, seq_lens = [chunk], [cached + chunk]
    if decodes_first:
        q_lens, seq_lens = [1] * decodes + q_lens, [decode_ctx] * decodes + seq_lens
    else:
        q_lens, seq_lens = q_lens + [1] * decodes, seq_lens + [decode_ctx] * decodes
    ms = time_attend(*make_step(q_lens, seq_lens))
    order = "decodes first" if decodes_first else "chunk first"
    return (f"mixed: {chunk}-token chunk over {cached} cached + {decodes} decodes at ctx "
            f"{decode_ctx} ({order}): {ms * 1e3:8.1f} us")


def sweep(name: str, values, run) -> None:
    """Runs `run` with triton_backend.<name> patched to each value in turn."""
    original = getattr(triton_backend, name)
    for value in values:
        patched = (lambda *args, cfg=value: cfg) if callable(original) else value
        setattr(triton_backend, name, patched)
        try:
            print(f"  {name} = {value}: {run()}", flush=True)
        except Exception as exc:  # out of resources and the like
            print(f"  {name} = {value}: failed ({type(exc).__name__})", flush=True)
    setattr(triton_backend, name, original)


def run_sweeps() -> None:
    for batch, ctx in ((1, 1024), (1, 8192)):
        print(f"sweep split count, decode batch {batch} ctx {ctx}")
        sweep("choose_num_splits", (4, 8, 16, 32, 64), lambda: bench_decode(batch, ctx).split(":")[1])
    for batch, ctx in ((1, 1024), (16, 1024), (1, 32768), (4, 8192)):
        print(f"sweep decode batch {batch} ctx {ctx}")
        sweep("PROGRAMS_PER_SM", (2, 4, 8, 16), lambda: bench_decode(batch, ctx).split(":")[1])
    decode = [KernelConfig(16, n, w, s) for n, w, s in ((64, 4, 3), (32, 2, 3), (64, 2, 3))]
    print("sweep decode batch 256 ctx 1024")
    sweep("decode_config", decode, lambda: bench_decode(256, 1024).split(":")[1])
    prefill = [KernelConfig(128, 128, 8, s) for s in (2, 3, 4)] + [KernelConfig(128, 64, 4, 3)]
    print("sweep prefill 4096")
    sweep("prefill_config", prefill, lambda: bench_prefill(4096).split(":")[1])


def invariant_decode_sweep() -> None:
    """Batch-invariant decode launches in other warp and stage counts (a row's bits must
    not move: checked against the current configuration's output), beside the default."""
    configs = [KernelConfig(16, 128, w, s) for w, s in ((4, 3), (4, 2), (4, 1), (8, 3),
                                                        (8, 2), (2, 2))]
    original = triton_backend.invariant_decode_config
    for batch, ctx in ((1, 1024), (64, 1024), (256, 512), (256, 1024)):
        step = make_step([1] * batch, [ctx] * batch)
        default_ms = time_attend(*step)
        reference = None
        print(f"invariant decode batch {batch} ctx {ctx}: default {default_ms * 1e3:.1f} us",
              flush=True)
        for config in configs:
            triton_backend.invariant_decode_config = lambda *args, cfg=config: cfg
            try:
                ms, out = time_and_output(*step, invariant=True)
            except Exception as exc:  # out of resources and the like
                print(f"  {config}: failed ({type(exc).__name__})", flush=True)
                continue
            finally:
                triton_backend.invariant_decode_config = original
            reference = out if reference is None else reference
            same = torch.equal(out, reference)
            print(f"  warps {config.num_warps} stages {config.num_stages}: {ms * 1e3:8.1f} us "
                  f"({ms / default_ms:.2f}x the default), bits "
                  f"{'the same' if same else 'DIFFERENT'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--invariant-sweep", action="store_true",
                        help="only the batch-invariant decode launch's warps and stages")
    args = parser.parse_args()
    if args.invariant_sweep:
        torch.manual_seed(0)
        invariant_decode_sweep()
        return
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  copy {copy_bandwidth() / 1e12:.2f} TB/s (read+write)")
    print(f"{NUM_HEADS} q heads, {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, {DTYPE}, "
          f"block {BLOCK_SIZE}, random block tables")
    for batch, ctx in ((1, 1024), (16, 1024), (64, 1024), (256, 1024), (1, 32768), (64, 8192)):
        print(bench_decode(batch, ctx), flush=True)
    print(bench_prefill(4096), flush=True)
    for decodes_first in (True, False):
        print(bench_mixed(2048, 4096, 128, 2048, decodes_first), flush=True)
    print(f"decode only: {bench_decode(128, 2048).split(':')[1]}", flush=True)
    if args.sweep:
        run_sweeps()


if __name__ == "__main__":
    main()
