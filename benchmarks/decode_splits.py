"""Decode attention's split-KV at small batch: each (split count, least KV tiles a split)
timed as one `attend` replayed from a CUDA graph (its reduction included), on a model
shape's heads. A decode step's graph keeps the split count chosen for the longest context
(max_model_len), so short contexts spread a tile or two over each of many programs;
PARASHIFT_ATTENTION_MIN_SPLIT_TILES gives each split at least that many tiles at run time.

Usage (GPU): python3 benchmarks/decode_splits.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --batch 1 --context 1024 4096 [--output decode_splits.json]"""
import torch
import triton.testing

from benchmarks import kernel_rows
from parashift.attention import triton_backend
from parashift.cost.measure_kernels import paged_step

SPLITS = (1, 8, 16, 32)
MIN_TILES = (1, 2, 4, 8)


def time_us(step, scale: float, splits: int, min_tiles: int) -> tuple[float, torch.Tensor]:
    q, k_cache, v_cache, meta = step
    chooser, tiles = triton_backend.choose_num_splits, triton_backend.MIN_SPLIT_TILES
    triton_backend.choose_num_splits = lambda *args: splits
    triton_backend.MIN_SPLIT_TILES = min_tiles
    try:
        backend = triton_backend.TritonAttentionBackend()
        fn = lambda: backend.attend(q, k_cache, v_cache, meta, scale)  # noqa: E731
        out = fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3, out
    finally:
        triton_backend.choose_num_splits, triton_backend.MIN_SPLIT_TILES = chooser, tiles


def measure(cfg: dict, context: int, args) -> list[dict]:
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    step = paged_step(torch.device("cuda"), torch.bfloat16, heads, kv_heads, head_dim,
                      [1] * args.batch, [context] * args.batch, 16, shuffled=True)
    rows, reference = [], None
    for splits in SPLITS:
        for min_tiles in MIN_TILES if splits > 1 else (1,):
            us, out = time_us(step, head_dim ** -0.5, splits, min_tiles)
            reference = out if reference is None else reference
            diff = (out.float() - reference.float()).abs().max().item()
            rows.append({"batch": args.batch, "context": context, "splits": splits,
                         "min_split_tiles": min_tiles, "us": round(us, 2),
                         "max_diff_vs_unsplit": diff})
    return rows


if __name__ == "__main__":
    kernel_rows.run(__doc__, "context", [1024, 4096], measure,
                    lambda p: p.add_argument("--batch", type=int, default=1))
