"""The Triton backend, with long prompts' attention through PyTorch's cuDNN SDPA (CUDA).

A sequence of at least LONG_PREFILL_TOKENS query tokens and no cached context runs
cuDNN's fused causal attention over its keys and values gathered from the paged pool; every
other sequence (decodes, short prompts, chunks against a cached prefix) and every CUDA-graph
step runs the Triton kernel. On one H200 (32 query / 8 KV heads, d 128, bf16, gather
counted) cuDNN reached 0.74-0.76 of the bf16 matrix peak at 8k-32k tokens against the Triton
kernel's 0.43-0.46, and lost below 4k (`benchmarks/prefill_attention.py`, 2026-11-29).

cuDNN builds an execution plan per shape (about 64 ms each, the first one about a second),
so a sequence is padded at its end to a multiple of PAD_TOKENS: rows past its length attend
causally to keys before them and are dropped, its own rows never see the padding."""
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.triton_backend import TritonAttentionBackend

LONG_PREFILL_TOKENS = int(os.environ.get("PARASHIFT_CUDNN_PREFILL_TOKENS", "4096"))
PAD_TOKENS = 512


def cudnn_attention_available(device: torch.device) -> bool:
    return (device.type == "cuda" and torch.backends.cudnn.is_available()
            and torch.cuda.get_device_capability(device) >= (8, 0))


class CudnnPrefillAttentionBackend(TritonAttentionBackend):
    name = "cudnn"

    def __init__(self, long_prefill_tokens: int = LONG_PREFILL_TOKENS):
        super().__init__(batch_invariant=False)
        if long_prefill_tokens < 1:
            raise ValueError(f"long_prefill_tokens must be >= 1, got {long_prefill_tokens}")
        self.long_prefill_tokens = long_prefill_tokens

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        long = [] if meta.static_shape else self._long_prompts(meta)
        if not long:
            return super().attend(q, k_cache, v_cache, meta, scale)
        if q.shape[1] % k_cache.shape[2]:
            raise ValueError(f"{q.shape[1]} query heads do not share {k_cache.shape[2]} "
                             "KV heads evenly")
        starts = meta.query_start_loc_cpu
        out = torch.empty_like(q)
        if starts[-1] < q.shape[0]:
            out[starts[-1]:].zero_()
        q = q if q.stride(-1) == 1 else q.contiguous()
        first = 0
        for seq in long + [meta.num_seqs]:
            if first < seq:
                self.attend_seqs(out, q, k_cache, v_cache, meta, scale, first, seq)
            if seq < meta.num_seqs:
                rows = slice(starts[seq], starts[seq + 1])
                out[rows] = _causal_prompt(q[rows], k_cache, v_cache, meta.block_tables[seq],
                                           scale)
            first = seq + 1
        return out

    def _long_prompts(self, meta: AttentionMetadata) -> list[int]:
        """Sequences of a long prompt with nothing cached before it."""
        starts, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
        if meta.max_query_len < self.long_prefill_tokens:
            return []
        return [i for i in range(meta.num_seqs)
                if starts[i + 1] - starts[i] == seq_lens[i] >= self.long_prefill_tokens]


def _causal_prompt(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_table: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, heads, d], the whole context's queries -> [n, heads, d]."""
    length = q.shape[0]
    padded = -(-length // PAD_TOKENS) * PAD_TOKENS
    block_size = k_cache.shape[1]
    blocks = block_table[:-(-length // block_size)]
    k, v = (_padded_context(cache, blocks, length, padded) for cache in (k_cache, v_cache))
    q = F.pad(q, (0, 0, 0, 0, 0, padded - length)).transpose(0, 1).unsqueeze(0)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                             enable_gqa=True)
    return out[0, :, :length].transpose(0, 1)


def _padded_context(cache: torch.Tensor, blocks: torch.Tensor, length: int,
                    padded: int) -> torch.Tensor:
    """The first `length` tokens held in `blocks` of a [blocks, block_size, kv_heads, d]
    pool, zero-padded to `padded` -> [1, kv_heads, padded, d]."""
    context = cache[blocks].flatten(0, 1)[:length]
    return F.pad(context, (0, 0, 0, 0, 0, padded - length)).transpose(0, 1).unsqueeze(0)
