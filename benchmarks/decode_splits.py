"""Decode attention's split-KV at small batch: each split count timed as one `attend`
replayed from a CUDA graph (its reduction included), on a model shape's heads. A decode
step's graph keeps the split count chosen for the longest context (max_model_len:
`choose_num_splits`), whatever context it then runs at.

Usage (GPU): python3 benchmarks/decode_splits.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --batch 1 --context 1024 4096 [--output decode_splits.json]"""
import torch
import triton.testing

from benchmarks import kernel_rows
from parashift.attention import triton_backend
from parashift.cost.measure_kernels import paged_step

SPLITS = (1, 8, 16, 32)


def time_us(step, scale: float, splits: int) -> tuple[float, torch.Tensor]:
    q, k_cache, v_cache, meta = step
    chooser = triton_backend.choose_num_splits
    triton_backend.choose_num_splits = lambda *args: splits
    try:
        backend = triton_backend.TritonAttentionBackend()
        fn = lambda: backend.attend(q, k_cache, v_cache, meta, scale)  # noqa: E731
        out = fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3, out
    finally:
        triton_backend.choose_num_splits = chooser


def measure(cfg: dict, context: int, args) -> list[dict]:
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    step = paged_step(torch.device("cuda"), torch.bfloat16, heads, kv_heads, head_dim,
                      [1] * args.batch, [context] * args.batch, 16, shuffled=True)
    rows, reference = [], None
    for splits in SPLITS:
        us, out = time_us(step, head_dim ** -0.5, splits)
        reference = out if reference is None else reference
        diff = (out.float() - reference.float()).abs().max().item()
        rows.append({"batch": args.batch, "context": context, "splits": splits,
                     "us": round(us, 2), "max_diff_vs_unsplit": diff})
    return rows


if __name__ == "__main__":
    kernel_rows.run(__doc__, "context", [1024, 4096], measure,
                    lambda p: p.add_argument("--batch", type=int, default=1))
