"""Attention over this rank's heads and this rank's slice of the KV pool, RoPE
included. Under sequence parallelism the heads are exchanged for tokens around it.
An FP8 pool (kv_cache_dtype fp8) stores k / k_scale and v / v_scale in E4M3; the backends
cast what they read, and the scales are applied to the scores and the output: one scale
per tensor in the softmax scale and on the output; per KV head (a checkpoint's
calibration) on this rank's TP shard of q, k, v and the output, around the exchange of
heads, so that every split of the shard's heads carries them."""
from functools import partial

import torch
from torch import nn

from parashift.context import get_attention_context, get_context
from parashift.engine_switches import FUSED_QK_NORM
from parashift.lazy_tensor import as_tensor
from parashift.quantization.fp8 import is_fp8, to_fp8_range
from parashift.kernels import use_triton
from parashift.layers.layernorm import qk_norm
from parashift.parallel import ulysses

# FUSED_QK_NORM: a model's q/k norms (Qwen3) run inside the RoPE + KV-write kernel where it runs,
# outside deterministic mode (PARASHIFT_FUSED_QK_NORM=0: their own kernel before it). On an
# H200, Qwen3-30B-A3B's heads: 2.8 against 3.6 us at one token, 3.1 against 5.1 at 64
# (benchmarks/qk_norm_rope.py)


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 rotary_emb: nn.Module, kv_head_start: int = 0,
                 total_kv_heads: int | None = None):
        """num_heads / num_kv_heads: what this rank's TP shard computes (before SP), from
        the model's KV head `kv_head_start` of `total_kv_heads` (default: all of them)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.rotary_emb = rotary_emb
        self.k_cache = self.v_cache = torch.empty(0)  # bound to the pool by the model runner
        self.kv_head_start, self.total_kv_heads = kv_head_start, total_kv_heads or num_kv_heads
        # An FP8 pool's scales (stored = value / scale): 1.0, or the checkpoint's per tensor
        # (floats), or per KV head (fp32 tensors over this shard's KV heads)
        self.kv_scales: list = [1.0, 1.0]
        # (q_norm, k_norm): RMSNorms of each head before RoPE, set by a model that fuses them
        # (`take_qk_norms`); a tuple, not submodules: their weights stay the model's
        self.qk_norms: tuple | None = None
        self._head_scales: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}  # by slice
        if get_context().kv_fp8:
            for i, name in enumerate(("k_scale", "v_scale")):
                param = nn.Parameter(torch.ones(1, dtype=torch.float32), requires_grad=False)
                param.weight_loader = partial(self._load_kv_scale, i)
                param.checkpoint_optional = True
                setattr(self, name, param)

    def _load_kv_scale(self, which: int, param, loaded, shard_id=None) -> None:
        scale = as_tensor(loaded).float()
        if scale.numel() == 1:
            param.data.copy_(scale.reshape(1))
            self.kv_scales[which] = float(scale.reshape(()))
        elif scale.numel() == self.total_kv_heads:
            if not (scale > 0).all():
                raise ValueError("a KV cache scale per head is not positive")
            start = self.kv_head_start
            param.data = scale.reshape(-1)[start:start + self.num_kv_heads].to(param.device)
            self.kv_scales[which] = param.data
        else:
            raise ValueError(f"a KV cache scale of shape {tuple(scale.shape)} is neither per "
                             f"tensor nor per KV head ({self.total_kv_heads} heads)")
        if self.scales_per_head:  # both as tensors over this shard's KV heads
            self.kv_scales = [torch.full((self.num_kv_heads,), s, device=param.device)
                              if isinstance(s, float) else s for s in self.kv_scales]
            self._slice_head_scales()

    @property
    def scales_per_head(self) -> bool:
        return any(isinstance(s, torch.Tensor) for s in self.kv_scales)

    def kv_heads_per_rank(self, sp_size: int) -> int:
        """KV heads in this rank's cache: split over SP, or one (replicated) when too few."""
        return max(1, self.num_kv_heads // sp_size)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim], before RoPE."""
        ctx = get_attention_context()
        sp = ctx.sp
        fp8 = is_fp8(self.k_cache)
        fused = sp.size == 1 and use_triton(q) and not fp8
        q, k, norms = self._qk_norms(q, k, fused)
        if fused:  # q/k norms if any, RoPE, k/v into their slots, in one kernel or two
            from parashift.attention.rotate_attend import rotate_write_attend
            return rotate_write_attend(ctx.backend, positions, q, k, v, self.rotary_emb.cos_sin,
                                       self.k_cache, self.v_cache, ctx.attn, self.scale, norms)
        q, k = self.rotary_emb(positions, q, k, ctx.attn.derived)
        per_head = fp8 and self.scales_per_head
        if per_head:
            q, k, v = self._into_head_scales(q, k, v)
        if sp.size > 1:
            q, k, v = ulysses.scatter_heads(sp, q, k, v)
        if fp8:
            k_scale, v_scale = (1.0, 1.0) if per_head else self.kv_scales
            k, v = to_fp8_range(k, k_scale), to_fp8_range(v, v_scale)
        ctx.backend.write_kv(k, v, self.k_cache, self.v_cache, ctx.attn)
        if fp8 and not self.scales_per_head:  # scores and outputs scaled once
            k_scale, v_scale = self.kv_scales
            o = ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale * k_scale)
            o = o if v_scale == 1.0 else o * v_scale
        else:
            o = ctx.backend.attend(q, self.k_cache, self.v_cache, ctx.attn, self.scale)
        o = ulysses.gather_heads(sp, o) if sp.size > 1 else o
        return self._out_of_head_scales(o) if fp8 and self.scales_per_head else o

    def take_qk_norms(self, q_norm: nn.Module, k_norm: nn.Module) -> bool:
        """Whether this layer applies the model's q/k norms (FUSED_QK_NORM, outside
        deterministic mode); then the model passes q and k un-normed."""
        if FUSED_QK_NORM and not get_context().reduction_chunks:
            self.qk_norms = (q_norm, k_norm)
        return self.qk_norms is not None

    def _qk_norms(self, q: torch.Tensor, k: torch.Tensor, fused: bool) -> tuple:
        """(q, k, the rotary kernel's norms or None): the q/k norms left to that kernel where
        it runs and takes them, else applied here."""
        if self.qk_norms is None:
            return q, k, None
        q_norm, k_norm = self.qk_norms
        if (fused and q_norm.eps == k_norm.eps
                and q_norm.weight.dtype == k_norm.weight.dtype == q.dtype == k.dtype):
            return q, k, (q_norm.weight, k_norm.weight, q_norm.eps)
        return (*qk_norm(q_norm, k_norm, q, k), None)

    def _step_head_scales(self, query_heads: int) -> tuple[torch.Tensor, ...]:
        """(k, v) scales of the KV heads this step's plan runs and (k, v) of each of its
        query heads: the loaded shard's, or the slice of them that a plan narrowing the
        shard (Shift's TP plan, Flying's merges) runs."""
        key = (1, 0)
        if query_heads != self.num_heads:
            state = get_context().state
            key = state.plan.narrowing(state.rank) or key
            if self.num_heads // key[0] != query_heads:
                raise RuntimeError(f"a step of {query_heads} query heads on a shard of "
                                   f"{self.num_heads}: no slice of KV scales per head fits")
        return self._head_scales[key]

    def _slice_head_scales(self) -> None:
        """`_step_head_scales` for every slice a plan may run (made at load: no copy to
        the device in a step): the `position`-th of `factor` blocks of query heads, and
        their KV heads as `shift_weights.shift_rows` cuts them."""
        group = self.num_heads // self.num_kv_heads
        k_scale, v_scale = (s.float().cpu() for s in self.kv_scales)
        device = self.kv_scales[0].device
        self._head_scales = {}
        for factor in (f for f in range(1, self.num_heads + 1) if self.num_heads % f == 0):
            width = self.num_heads // factor
            for position in range(factor):
                kv = ulysses.kv_heads_for_block(position, factor, self.num_heads,
                                                self.num_kv_heads)
                by_query = [h // group for h in range(position * width, (position + 1) * width)]
                self._head_scales[factor, position] = tuple(
                    t.to(device).view(1, -1, 1) for t in (k_scale[kv], v_scale[kv],
                                                         k_scale[by_query], v_scale[by_query]))

    def _into_head_scales(self, q, k, v):
        """k / k_scale and v / v_scale per KV head, q * k_scale of its KV head: the scores
        are unchanged and the pool holds the scaled k and v."""
        k_scale, v_scale, q_scale, _ = self._step_head_scales(q.shape[1])
        k = (k.float() / k_scale).to(k.dtype)
        v = (v.float() / v_scale).to(v.dtype)
        return (q.float() * q_scale).to(q.dtype), k, v

    def _out_of_head_scales(self, o: torch.Tensor) -> torch.Tensor:
        """The output of v / v_scale, times v_scale of each query head's KV head."""
        return (o.float() * self._step_head_scales(o.shape[1])[3]).to(o.dtype)
