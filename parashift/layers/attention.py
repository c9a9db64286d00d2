"""Attention over this rank's heads and this rank's slice of the KV pool, RoPE
included. Under sequence parallelism the heads are exchanged for tokens around it.
An FP8 pool (kv_cache_dtype fp8) stores k / k_scale and v / v_scale in E4M3; the backends
cast what they read, and the scales are applied to the scores and the output."""
from functools import partial

import torch
from torch import nn

from parashift.context import get_attention_context, get_context
from parashift.lazy_tensor import as_tensor
from parashift.quantization.fp8 import is_fp8, to_fp8_range
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
        # An FP8 pool's scales (stored = value / scale): 1.0, or the checkpoint's per tensor
        self.kv_scales = [1.0, 1.0]
        if get_context().kv_fp8:
            for i, name in enumerate(("k_scale", "v_scale")):
                param = nn.Parameter(torch.ones(1, dtype=torch.float32), requires_grad=False)
                param.weight_loader = partial(self._load_kv_scale, i)
                param.checkpoint_optional = True
                setattr(self, name, param)

    def _load_kv_scale(self, which: int, param, loaded, shard_id=None) -> None:
        scale = as_tensor(loaded).float()
        if scale.numel() != 1:
            raise ValueError(f"KV cache scales per head (shape {tuple(scale.shape)}) are not "
                             "supported yet: per tensor only")
        param.data.copy_(scale.reshape(1))
        self.kv_scales[which] = float(scale.reshape(()))

    def kv_heads_per_rank(self, sp_size: int) -> int:
        """KV heads in this rank's cache: split over SP, or one (replicated) when too few."""
        return max(1, self.num_kv_heads // sp_size)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim], before RoPE."""
        ctx = get_attention_context()
        sp = ctx.sp
        fp8 = is_fp8(self.k_cache)
        if sp.size == 1 and use_triton(q) and not fp8:  # one kernel: RoPE, k/v into their slots
            from parashift.kernels import rotary
            q = rotary.rotate_and_write_kv(positions, q, k, v, self.rotary_emb.cos_sin,
                                           self.k_cache, self.v_cache, ctx.attn.slot_mapping)
        else:
            q, k = self.rotary_emb(positions, q, k)
            if sp.size > 1:
                q, k, v = ulysses.scatter_heads(sp, q, k, v)
            if fp8:
                k, v = to_fp8_range(k, self.kv_scales[0]), to_fp8_range(v, self.kv_scales[1])
            ctx.backend.write_kv(k, v, self.k_cache, self.v_cache, ctx.attn)
        if fp8:  # scores and outputs scaled once, not every element read
            k_scale, v_scale = self.kv_scales
            o = ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale * k_scale)
            o = o if v_scale == 1.0 else o * v_scale
        else:
            o = ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale)
        return ulysses.gather_heads(sp, o) if sp.size > 1 else o
