"""Qwen3's q/k norms then RoPE + KV write at decode: two launches (kernels/rmsnorm.py's heads
kernel, kernels/rotary.rotate_and_write_kv) against one (rotate_and_write_kv's `norms`), in
µs per call timed as decode runs them (kernels/gemm_timing.py: 16 calls in a CUDA graph, PDL
suspended, medians over rounds), with the largest difference of their q outputs (a check).

Usage (GPU): python3 benchmarks/qk_norm_rope.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --tokens 1 64 [--output qk_norm_rope.json]"""
from types import SimpleNamespace

import torch

from benchmarks import kernel_rows
from parashift.kernels import gemm_timing, pdl, rotary
from parashift.layers.layernorm import RMSNorm, qk_norm
from parashift.layers.rotary import RotaryEmbedding

BLOCK_SIZE = 16


def measure(cfg: dict, tokens: int) -> dict:
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda",
                      dtype=torch.bfloat16)
    q, k, v = (t.unflatten(-1, (-1, head_dim)) for t in
               qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1))
    norms = [RMSNorm(head_dim, cfg["rms_norm_eps"]).to("cuda", torch.bfloat16) for _ in range(2)]
    for norm in norms:
        norm.weight.data.uniform_(0.5, 1.5)
    rope = RotaryEmbedding(SimpleNamespace(rope_theta=cfg["rope_theta"]), head_dim,
                           4096).to("cuda")
    positions = torch.randint(4096, (tokens,), device="cuda")
    pool = torch.zeros(tokens // BLOCK_SIZE + 1, BLOCK_SIZE, kv_heads, head_dim,
                       device="cuda", dtype=torch.bfloat16)
    v_pool = torch.zeros_like(pool)
    slots = torch.arange(tokens, device="cuda")

    def two_launches(_i):
        q_n, k_n = qk_norm(*norms, q, k)
        return rotary.rotate_and_write_kv(positions, q_n, k_n, v, rope.cos_sin, pool, v_pool,
                                          slots)

    def one_launch(_i):
        return rotary.rotate_and_write_kv(positions, q, k, v, rope.cos_sin, pool, v_pool, slots,
                                          (norms[0].weight, norms[1].weight, norms[0].eps))
    diff = (two_launches(0).float() - one_launch(0).float()).abs().max().item()
    with pdl.suspended():
        timings = gemm_timing.replayed_timings_ms({"two": two_launches, "one": one_launch}, 1)
    return {"tokens": tokens, "two_launches_us": round(timings["two"] * 1e3, 2),
            "one_launch_us": round(timings["one"] * 1e3, 2), "max_q_diff": diff}


if __name__ == "__main__":
    kernel_rows.run(__doc__, "tokens", [1, 64], lambda cfg, tokens, _args: [measure(cfg, tokens)])
