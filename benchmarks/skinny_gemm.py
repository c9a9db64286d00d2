"""cuBLAS against the skinny GEMM's configs on the projections of a model shape, at 1 to 4
rows (decode at small batch), as a fraction of the weight-streaming floor.

Usage (GPU): python3 benchmarks/skinny_gemm.py --model benchmarks/shapes/llama-3.1-8b.json [--tp 2]
"""
import argparse
import json

import torch
import triton

from parashift.kernels.skinny_gemm import CONFIGS, GEMV_CONFIGS, choose, label, timings_ms


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms * 1e-3)


def projections(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection of one layer, on one rank of TP."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    return {"qkv": ((q + 2 * kv) // tp, h), "o": (h, q // tp),
            "gate_up": (2 * inter // tp, h), "down": (h, inter // tp)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    cfg = json.load(open(args.model))
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}  copy {bandwidth / 1e12:.2f} TB/s")
    for name, (n, k) in projections(cfg, args.tp).items():
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
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
