"""Attention over this rank's heads and this rank's slice of the KV pool, RoPE
included. Under sequence parallelism the heads are exchanged for tokens around it."""
import torch
from torch import nn

from parashift.context import get_attention_context
from parashift.kernels import use_triton
from parashift.parallel import ulysses


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 rotary_emb: nn.Module):
        """num_heads / num_kv_heads: what this rank's TP shard computes (before SP)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.rotary_emb = rotary_emb
        self.k_cache = self.v_cache = torch.empty(0)  # bound to the pool by the model runner

    def kv_heads_per_rank(self, sp_size: int) -> int:
        """KV heads in this rank's cache: split over SP, or one (replicated) when too few."""
        return max(1, self.num_kv_heads // sp_size)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim], before RoPE."""
        ctx = get_attention_context()
        sp = ctx.sp
        if sp.size == 1 and use_triton(q):  # one kernel: RoPE, and k/v into their slots
            from parashift.kernels import rotary
            q = rotary.rotate_and_write_kv(positions, q, k, v, self.rotary_emb.cos_sin,
                                           self.k_cache, self.v_cache, ctx.attn.slot_mapping)
        else:
            q, k = self.rotary_emb(positions, q, k)
            if sp.size > 1:
                q, k, v = ulysses.scatter_heads(sp, q, k, v)
            ctx.backend.write_kv(k, v, self.k_cache, self.v_cache, ctx.attn)
        o = ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale)
        return ulysses.gather_heads(sp, o) if sp.size > 1 else o
