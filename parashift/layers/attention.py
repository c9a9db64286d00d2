"""Attention over this rank's heads and this rank's slice of the KV pool."""
import torch
from torch import nn

from parashift.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.k_cache = self.v_cache = torch.empty(0)  # bound to the pool by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim]."""
        ctx = get_forward_context()
        ctx.backend.write_kv(k, v, self.k_cache, self.v_cache, ctx.attn)
        return ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale)
