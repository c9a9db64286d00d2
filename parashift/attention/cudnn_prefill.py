"""The Triton backend, with long prompts' attention through PyTorch's cuDNN SDPA (CUDA).

A sequence of at least LONG_PREFILL_TOKENS query tokens and no cached context runs
cuDNN's fused causal attention over its keys and values gathered from the paged pool; a
long chunk against a long cached prefix runs two cuDNN calls (`cudnn_chunk`); every other
sequence (decodes, short prompts and chunks) and every CUDA-graph step runs the Triton
kernel. On one H200 (32 query / 8 KV heads, d 128, bf16, gather
counted) cuDNN reached 0.74-0.76 of the bf16 matrix peak at 8k-32k tokens against the Triton
kernel's 0.43-0.46, and lost below 4k (`benchmarks/prefill_attention.py`, 2026-11-29).

A sequence whose blocks are one ascending run of the pool (as a fresh pool hands out a
prompt's) reads its keys and values as a view of the pool, not a gather; a step of one
such prompt returns cuDNN's output as it is (two gathers and a copy a layer fewer).

cuDNN builds an execution plan per shape (about 64 ms each, the first one about a second),
so a sequence is padded at its end to a multiple of PAD_TOKENS: rows past its length attend
causally to keys before them and are dropped, its own rows never see the padding."""
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from parashift.attention import cudnn_chunk
from parashift.attention.cudnn_chunk import PAD_TOKENS, pad_rows
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.triton_backend import TritonAttentionBackend

LONG_PREFILL_TOKENS = int(os.environ.get("PARASHIFT_CUDNN_PREFILL_TOKENS", "4096"))
# A chunk of at least CHUNK_TOKENS after a cached prefix, its context at least CHUNK_CONTEXT
# long, takes two cuDNN calls (`cudnn_chunk`): 2,048 after 30,720 took 1.93 ms against the
# Triton kernel's 3.21, 8,192 after 8,192 3.47 against 4.47
CHUNK_TOKENS = int(os.environ.get("PARASHIFT_CUDNN_CHUNK_TOKENS", "2048"))
CHUNK_CONTEXT = 8192
def cudnn_attention_available(device: torch.device) -> bool:
    return (device.type == "cuda" and torch.backends.cudnn.is_available()
            and torch.cuda.get_device_capability(device) >= (8, 0))


class CudnnPrefillAttentionBackend(TritonAttentionBackend):
    name = "cudnn"

    def __init__(self, long_prefill_tokens: int = LONG_PREFILL_TOKENS,
                 chunk_tokens: int = CHUNK_TOKENS, chunk_context: int = CHUNK_CONTEXT):
        super().__init__(batch_invariant=False)
        if min(long_prefill_tokens, chunk_tokens, chunk_context) < 1:
            raise ValueError("the cuDNN routes' thresholds must be >= 1, got "
                             f"{long_prefill_tokens}, {chunk_tokens}, {chunk_context}")
        self.long_prefill_tokens = long_prefill_tokens
        self.chunk_tokens, self.chunk_context = chunk_tokens, chunk_context

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        routed = {} if meta.static_shape else self._step_routes(meta, q.device)
        if not routed:
            return super().attend(q, k_cache, v_cache, meta, scale)
        if q.shape[1] % k_cache.shape[2]:
            raise ValueError(f"{q.shape[1]} query heads do not share {k_cache.shape[2]} "
                             "KV heads evenly")
        starts = meta.query_start_loc_cpu
        q = q if q.stride(-1) == 1 else q.contiguous()
        if meta.num_seqs == 1 and starts[-1] == q.shape[0]:  # one prompt, the whole step:
            route, blocks = routed[0]  # its output as cuDNN gives it (in q's layout: no copy)
            out = route(q, k_cache, v_cache, blocks, meta.seq_lens_cpu[0], scale)
            return out if out.is_contiguous() else out.contiguous()
        out = torch.empty_like(q)
        if starts[-1] < q.shape[0]:
            out[starts[-1]:].zero_()
        first = 0
        for seq in sorted(routed) + [meta.num_seqs]:
            if first < seq:
                self.attend_seqs(out, q, k_cache, v_cache, meta, scale, first, seq)
            if seq < meta.num_seqs:
                rows = slice(starts[seq], starts[seq + 1])
                route, blocks = routed[seq]
                out[rows] = route(q[rows], k_cache, v_cache, blocks, meta.seq_lens_cpu[seq],
                                  scale)
            first = seq + 1
        return out

    def _step_routes(self, meta: AttentionMetadata, device: torch.device) -> dict:
        """Sequence -> (its cuDNN route, its blocks: the pool's slice where they are one
        ascending run, else its block table), found at the step's first layer."""
        if "cudnn_routes" not in meta.derived:
            routes = meta.derived["cudnn_routes"] = {}
            for seq, route in self._routes(meta, device).items():
                run = block_run(meta, seq)
                routes[seq] = route, meta.block_tables[seq] if run is None else run
        return meta.derived["cudnn_routes"]

    def _routes(self, meta: AttentionMetadata, device: torch.device) -> dict:
        """Sequence -> its cuDNN route: a long prompt with nothing cached before it, or a
        long chunk of a long context."""
        starts, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
        if meta.max_query_len < min(self.long_prefill_tokens, self.chunk_tokens):
            return {}
        routes = {}
        for i in range(meta.num_seqs):
            q_len, seq_len = starts[i + 1] - starts[i], seq_lens[i]
            if q_len == seq_len >= self.long_prefill_tokens:
                routes[i] = _causal_prompt
            elif (seq_len > q_len >= self.chunk_tokens and seq_len >= self.chunk_context
                  and cudnn_chunk.available(device.index or 0)):
                routes[i] = _chunk_after_prefix
        return routes


def block_run(meta: AttentionMetadata, seq: int) -> slice | None:
    """The pool's blocks of sequence `seq`'s context as a slice where its block table
    holds one ascending run of them (a fresh pool hands a prompt's blocks out in order):
    its context is then a view of the pool, not a gather. None where it is not one run or
    the step has no host copy of its block tables."""
    tables = meta.block_tables_cpu
    if tables is None:
        return None
    blocks = tables[seq, :-(-meta.seq_lens_cpu[seq] // meta.block_size)]
    first = int(blocks[0])
    if not np.array_equal(blocks, np.arange(first, first + len(blocks), dtype=blocks.dtype)):
        return None
    return slice(first, first + len(blocks))


def _chunk_after_prefix(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        blocks: torch.Tensor | slice, seq_len: int, scale: float
                        ) -> torch.Tensor:
    k, v = (_context(cache, blocks, seq_len, q.dtype) for cache in (k_cache, v_cache))
    return cudnn_chunk.chunk_attention(q, k, v, scale)


def _context(cache: torch.Tensor, blocks: torch.Tensor | slice, length: int,
             dtype: torch.dtype) -> torch.Tensor:
    """The first `length` tokens of a sequence in a [blocks, block_size, kv_heads, d] pool
    -> [length, kv_heads, d] in `dtype` (an FP8 pool's values cast; its scales are applied
    to the scores and the output by the caller). blocks: its block table (gathered), or
    the slice of the pool its blocks are (a view)."""
    if not isinstance(blocks, slice):
        blocks = blocks[:-(-length // cache.shape[1])]
    return cache[blocks].flatten(0, 1)[:length].to(dtype)


def _causal_prompt(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   blocks: torch.Tensor | slice, seq_len: int, scale: float) -> torch.Tensor:
    """q: [n, heads, d], the whole context's queries -> [n, heads, d]."""
    length = q.shape[0]
    padded = -(-length // PAD_TOKENS) * PAD_TOKENS
    k, v = (pad_rows(_context(cache, blocks, length, q.dtype), padded)
            .transpose(0, 1).unsqueeze(0) for cache in (k_cache, v_cache))
    q = pad_rows(q, padded).transpose(0, 1).unsqueeze(0)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                             enable_gqa=True)
    return out[0, :, :length].transpose(0, 1)

