"""A prompt's chunk against its cached prefix in two cuDNN attention calls (CUDA).

cuDNN's fused kernel skips the masked tiles of a causal mask aligned top-left only; the
lower-right mask a chunk after a prefix needs ran at a third of the matrix peak. So the
chunk's context is cut at a multiple of PAD_TOKENS below the prefix's end:
  - every query row against the keys before the cut: no mask, a KV head's query heads
    packed as rows of one head (no copies of K and V);
  - the rest of the context causally against itself, `rem` discarded query rows put before
    the chunk's so that the top-left mask is the chunk's lower-right one, its KV heads
    shared by their query heads in the call (GQA) where cuDNN takes that;
and the two partial results are merged by their log-sum-exps in one kernel
(`kernels/lse_merge.py`) that reads both where cuDNN left them. Shapes are padded to
multiples of PAD_TOKENS: cuDNN builds a plan per shape (about 64 ms each). On one H200
(8B heads) this ran at 0.60-0.70 of the bf16 matrix peak where the Triton kernel ran at
0.43-0.47 (`benchmarks/prefill_attention.py`, 2026-11-29, before the merge kernel and GQA).
PARASHIFT_CUDNN_CHUNK_FUSED=0: K and V repeated per query head and the merge in PyTorch
operations in fp32 (session 43's route, less its copies of rows that needed no padding),
for A/B runs.

`torch.ops.aten._scaled_dot_product_cudnn_attention` (the call that returns the log-sum-exp)
is PyTorch-internal: `available()` checks that it runs here, once, and `gqa_available()`
that it takes fewer KV heads than query heads."""
import functools
import logging

import torch
import torch.nn.functional as F

from parashift.engine_switches import switch
from parashift.kernels import lse_merge

logger = logging.getLogger(__name__)

PAD_TOKENS = 512
ENV = "PARASHIFT_CUDNN_CHUNK_FUSED"


def _switch() -> bool:
    """PARASHIFT_CUDNN_CHUNK_FUSED: 1 the merge kernel, GQA in the call; 0 K and V repeated,
    the merge in PyTorch."""
    return switch(ENV, "1")


# both read at each call (benchmarks/prefill_attention.py switches them apart)
FUSED_MERGE = NATIVE_GQA = _switch()


def _padded(n: int) -> int:
    return -(-n // PAD_TOKENS) * PAD_TOKENS


def pad_rows(x: torch.Tensor, rows: int, before: int = 0) -> torch.Tensor:
    """x [n, ..] with `before` zero rows first and zero rows after to `rows` in all; x itself
    where it has them (F.pad copies even a pad of nothing: the q, k and v of a layer)."""
    after = rows - before - x.shape[0]
    if before == after == 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 1) + (before, after))


def _with_lse(q, k, v, causal: bool, scale: float):
    """[1, heads, rows, d] q, [1, kv_heads, rows, d] k and v (kv_heads = heads unless
    `gqa_available`) -> (out [heads, rows, d], natural-log LSE [heads, rows])."""
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


@functools.cache
def gqa_available(device_index: int) -> bool:
    """Whether the LSE-returning call takes 2 query heads on 1 KV head and gives what it
    gives with the KV head repeated."""
    gen = torch.Generator(f"cuda:{device_index}").manual_seed(0)
    q, k, v = (torch.randn(1, heads, PAD_TOKENS, 64, generator=gen, device=gen.device,
                           dtype=torch.bfloat16) for heads in (2, 1, 1))
    try:
        shared = _with_lse(q, k, v, True, 0.125)
    except (AssertionError, RuntimeError, TypeError) as exc:
        logger.info("cuDNN attention with log-sum-exp takes no GQA (%s): K and V repeated", exc)
        return False
    repeated = _with_lse(q, *(t.repeat_interleave(2, dim=1) for t in (k, v)), True, 0.125)
    return all(torch.allclose(a.float(), b.float(), atol=2e-2, rtol=0)
               for a, b in zip(shared, repeated))


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
        return out_b.reshape(n, heads, d)
    out_a, lse_a = _before_cut(q, context_k[:cut], context_v[:cut], group, scale)
    merge = lse_merge.merge if FUSED_MERGE else lse_merge.merge_torch
    return merge(out_a, lse_a, out_b, lse_b, q.dtype)


def _before_cut(q, k, v, group: int, scale: float):
    """Every query row against keys [0, cut): views of cuDNN's output and LSE as
    ([n, kv_heads, group, d], [n, kv_heads, group])."""
    n, heads, d = q.shape
    kv_heads = heads // group
    rows = _padded(n)
    packed = pad_rows(q, rows).view(rows, kv_heads, group, d)
    packed = packed.permute(1, 0, 2, 3).reshape(1, kv_heads, rows * group, d)
    out, lse = _with_lse(packed, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                         False, scale)
    return (out.view(kv_heads, rows, group, d)[:, :n].permute(1, 0, 2, 3),
            lse.view(kv_heads, rows, group)[:, :n].permute(1, 0, 2))


def _causal_tail(q, k, v, rem: int, group: int, scale: float):
    """The chunk's rows against keys [cut, seq_len), causally, `rem` discarded rows first:
    views as `_before_cut`'s."""
    n, heads, d = q.shape
    kv_heads = heads // group
    length = rem + n
    rows = _padded(length)
    q = pad_rows(q, rows, before=rem).transpose(0, 1).unsqueeze(0)
    k, v = (pad_rows(t, rows).transpose(0, 1).unsqueeze(0) for t in (k, v))
    if group > 1 and not (NATIVE_GQA and gqa_available(q.device.index or 0)):
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    out, lse = _with_lse(q, k, v, True, scale)
    return (out.view(kv_heads, group, rows, d)[:, :, rem:length].permute(2, 0, 1, 3),
            lse.view(kv_heads, group, rows)[:, :, rem:length].permute(2, 0, 1))
