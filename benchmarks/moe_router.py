"""A MoE layer's router at decode rows: the gate GEMM then the routing kernel (cuBLAS, or
the skinny GEMM's choice for the shape: today's path) against the one-launch router
(kernels/moe_router.py) over its tiles (experts per program, warps), in µs per call as decode
runs them (kernels/gemm_timing.py: 16 calls in a CUDA graph, each on another copy of the
weight, PDL suspended, medians over rounds). Each row also says whether the fused router
picked the same experts and weights as today's path on one random input (a check).

Usage (GPU): python3 benchmarks/moe_router.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --tokens 1 2 4 [--output moe_router.json]"""
import torch
import torch.nn.functional as F

from benchmarks import kernel_rows
from parashift.kernels import gemm_timing, moe_router, moe_routing, pdl, skinny_gemm

TILES = [(1, 4), (1, 2), (1, 1), (2, 1), (2, 4), (4, 8)]  # (block_e, num_warps)


def candidates(top_k: int, renormalize: bool) -> dict:
    def unfused(matmul):
        return lambda x, w: moe_routing.route(matmul(x, w, None), top_k, renormalize)

    def fused(block_e, warps):
        return lambda x, w: moe_router.route_from_hidden(x, w, top_k, renormalize, block_e,
                                                         warps)
    return {"cublas+route": unfused(F.linear), "chosen+route": unfused(skinny_gemm.linear),
            **{("fused", *tile): fused(*tile) for tile in TILES}}


def measure(cfg: dict, tokens: int) -> dict:
    top_k, renormalize = cfg["num_experts_per_tok"], cfg["norm_topk_prob"]
    weight = torch.randn(cfg["num_experts"], cfg["hidden_size"], device="cuda",
                         dtype=torch.bfloat16) * cfg["hidden_size"] ** -0.5
    copies = gemm_timing.weight_copies(weight)
    xs = [torch.randn(tokens, cfg["hidden_size"], device="cuda", dtype=torch.bfloat16)
          for _ in copies]
    runs = candidates(top_k, renormalize)
    runs["chosen+route"](xs[0], weight)  # the skinny GEMM measures the shape here
    ref, out = runs["chosen+route"](xs[0], weight), runs["fused", 1, 4](xs[0], weight)
    with pdl.suspended():
        timings = gemm_timing.replayed_timings_ms(
            {k: (lambda i, fn=fn: fn(xs[i], copies[i])) for k, fn in runs.items()}, len(copies))
    us = {("-".join(map(str, k)) if isinstance(k, tuple) else k): round(v * 1e3, 2)
          for k, v in timings.items()}
    fused_keys = [k for k in us if k.startswith("fused")]
    best = min(fused_keys, key=us.get)
    return {"tokens": tokens, "us": us, "best_fused": best,
            "best_over_chosen": round(us[best] / us["chosen+route"], 3),
            "gate_choice": skinny_gemm.chosen(),
            "same_ids": bool(torch.equal(out[1], ref[1])),
            "max_weight_diff": (out[0].float() - ref[0].float()).abs().max().item()}


if __name__ == "__main__":
    kernel_rows.run(__doc__, "tokens", [1, 2, 4], lambda cfg, tokens, _args: [measure(cfg, tokens)])
