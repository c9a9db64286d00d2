"""cuBLAS against the skinny GEMM's configs on the projections of a model shape, at 1 to 4
rows (decode at small batch), as a fraction of the weight-streaming floor.

Usage (GPU): python3 benchmarks/skinny_gemm.py --model benchmarks/shapes/llama-3.1-8b.json [--tp 2]
    [--rows 1 2 4] [--projections qkv o gate_up down lm_head] [--tma-gemv]
--tma-gemv: kernels/fp8_gemv_tma.py's GEMV on the 16-bit weight (a scale of ones) beside them,
timed alike (not a candidate of the choice).
"""
import argparse
import json

import torch
import triton

from parashift.kernels import gemm_timing
from parashift.kernels.fp8_gemv_tma import fp8_gemv_tma
from parashift.kernels.skinny_gemm import CONFIGS, GEMV_CONFIGS, choose, label, timings_ms, \
    unit_scale

# (block_n, block_k, warps, stages) of the TMA GEMV timed with --tma-gemv
TMA_GEMV_SHAPES = ((8, 128, 4, 8), (16, 128, 4, 6), (8, 256, 4, 6), (16, 128, 2, 8),
                   (32, 128, 4, 4))


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms * 1e-3)


def projections(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection of one layer and of the LM head, on one rank of TP."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    return {"qkv": ((q + 2 * kv) // tp, h), "o": (h, q // tp),
            "gate_up": (2 * inter // tp, h), "down": (h, inter // tp),
            "lm_head": (cfg["vocab_size"] // tp, h)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--projections", nargs="+", default=["qkv", "o", "gate_up", "down"],
                   choices=["qkv", "o", "gate_up", "down", "lm_head"])
    p.add_argument("--tma-gemv", action="store_true")
    args = p.parse_args()
    cfg = json.load(open(args.model))
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}  copy {bandwidth / 1e12:.2f} TB/s")
    for name in args.projections:
        n, k = projections(cfg, args.tp)[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        floor_ms = w.nbytes / bandwidth * 1e3
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            timings = timings_ms(x, w, None)
            chosen = choose(timings)
            row = {"proj": name, "n": n, "k": k, "rows": m, "floor_us": round(floor_ms * 1e3, 1),
                   "cublas_us": round(timings[None] * 1e3, 1),
                   "cublas_fraction": round(floor_ms / timings[None], 3),
                   "configs_us": {label(c): round(timings[c] * 1e3, 1)
                                  for c in CONFIGS + GEMV_CONFIGS if c in timings},
                   "chosen": label(chosen),
                   "chosen_fraction": round(floor_ms / timings[chosen], 3)}
            if args.tma_gemv:
                row["tma_gemv_us"] = tma_gemv_us(x, w)
            print(json.dumps(row), flush=True)


def tma_gemv_us(x: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    """µs a call of each TMA_GEMV_SHAPES config on w, in CUDA graphs over copies of it."""
    copies, ones = gemm_timing.weight_copies(w), unit_scale(w.shape[0], w.device)
    runs = {shape: lambda i, shape=shape: fp8_gemv_tma(x, copies[i], ones, None, *shape)
            for shape in TMA_GEMV_SHAPES}
    timings = gemm_timing.replayed_timings_ms(runs, len(copies))
    return {"x".join(map(str, shape)): round(ms * 1e3, 1) for shape, ms in timings.items()}


if __name__ == "__main__":
    main()
