"""A prompt's chunk against its cached prefix in two cuDNN attention calls (CUDA).

cuDNN's fused kernel skips the masked tiles of a causal mask aligned top-left only; the
lower-right mask a chunk after a prefix needs ran at a third of the matrix peak. So the
chunk's context is cut at a multiple of PAD_TOKENS below the prefix's end:
  - every query row against the keys before the cut: no mask, a KV head's query heads
    packed as rows of one head (no copies of K and V);
  - the rest of the context causally against itself, `rem` discarded query rows put before
    the chunk's so that the top-left mask is the chunk's lower-right one;
and the two partial results are merged by their log-sum-exps. Shapes are padded to
multiples of PAD_TOKENS: cuDNN builds a plan per shape (about 64 ms each). On one H200
(8B heads) this ran at 0.60-0.70 of the bf16 matrix peak where the Triton kernel ran at
0.43-0.47 (`benchmarks/prefill_attention.py`, 2026-11-29).

`torch.ops.aten._scaled_dot_product_cudnn_attention` (the call that returns the log-sum-exp)
is PyTorch-internal: `available()` checks that it runs here, once."""
import functools
import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

PAD_TOKENS = 512


def _padded(n: int) -> int:
    return -(-n // PAD_TOKENS) * PAD_TOKENS


def _with_lse(q, k, v, causal: bool, scale: float):
    """[1, heads, rows, d] each (equal head counts) -> (out, natural-log LSE [heads, rows])."""
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out[0], lse.reshape(out.shape[1:3])


@functools.cache
def available(device_index: int) -> bool:
    """Whether the LSE-returning cuDNN call runs on this device and PyTorch."""
    try:
        x = torch.zeros(1, 2, PAD_TOKENS, 64, dtype=torch.bfloat16, device=f"cuda:{device_index}")
        _with_lse(x, x, x, True, 1.0)
        return True
    except (AttributeError, AssertionError, RuntimeError, TypeError) as exc:
        logger.info("cuDNN attention with log-sum-exp unavailable (%s): chunks after a "
                    "prefix take the Triton kernel", exc)
        return False


def chunk_attention(q: torch.Tensor, context_k: torch.Tensor, context_v: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """q: [n, heads, d], the last n positions of the context [seq_len, kv_heads, d] ->
    [n, heads, d]."""
    n, heads, d = q.shape
    seq_len, kv_heads = context_k.shape[:2]
    group = heads // kv_heads
    cut = (seq_len - n) // PAD_TOKENS * PAD_TOKENS
    rem = seq_len - n - cut
    out_b, lse_b = _causal_tail(q, context_k[cut:], context_v[cut:], rem, group, scale)
    if cut == 0:
        return out_b.to(q.dtype)
    out_a, lse_a = _before_cut(q, context_k[:cut], context_v[:cut], group, scale)
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * (lse_a - lse).exp().unsqueeze(-1) + out_b * (lse_b - lse).exp().unsqueeze(-1)
    return out.to(q.dtype)


def _before_cut(q, k, v, group: int, scale: float):
    """Every query row against keys [0, cut): fp32 ([n, heads, d], [n, heads])."""
    n, heads, d = q.shape
    kv_heads = heads // group
    rows = _padded(n)
    packed = F.pad(q, (0, 0, 0, 0, 0, rows - n)).view(rows, kv_heads, group, d)
    packed = packed.permute(1, 0, 2, 3).reshape(1, kv_heads, rows * group, d)
    out, lse = _with_lse(packed, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                         False, scale)
    out = out.view(kv_heads, rows, group, d)[:, :n].permute(1, 0, 2, 3).reshape(n, heads, d)
    lse = lse.view(kv_heads, rows, group)[:, :n].permute(1, 0, 2).reshape(n, heads)
    return out.float(), lse


def _causal_tail(q, k, v, rem: int, group: int, scale: float):
    """The chunk's rows against keys [cut, seq_len), causally, `rem` discarded rows first:
    fp32 ([n, heads, d], [n, heads])."""
    n = q.shape[0]
    length = rem + n
    rows = _padded(length)
    q = F.pad(q, (0, 0, 0, 0, rem, rows - length)).transpose(0, 1).unsqueeze(0)
    k, v = (F.pad(t, (0, 0, 0, 0, 0, rows - length)).transpose(0, 1)
            .repeat_interleave(group, dim=0).unsqueeze(0) for t in (k, v))
    out, lse = _with_lse(q, k, v, True, scale)
    return out[:, rem:length].transpose(0, 1).float(), lse[:, rem:length].transpose(0, 1)
