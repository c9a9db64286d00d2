"""Attention in plain PyTorch, fast on the CPU: all the sequences of a step in one SDPA call
per layer (`torch_ref` is the per-sequence reference it is tested against).

The step's contexts are gathered from the paged pool block by block, padded to the longest
([seqs, kv_heads, max_seq_len, d]); its queries padded to the longest query and laid out
per KV head ([seqs, kv_heads, group * max_query_len, d]: the heads sharing a KV head side
by side, so GQA needs no expanded K/V); one mask says which positions each query sees. The
indices and the mask depend only on the step, so the first layer builds them and the
others reuse them from the metadata."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_ref import write_kv_slots


@dataclass
class StepLayout:
    """Where a step's queries and keys sit in the padded batch."""
    seqs: int
    max_query_len: int
    context_len: int             # the longest context: keys per sequence after padding
    blocks: torch.Tensor         # [seqs * blocks_per_seq] pool blocks to gather, in order
    key_padding: torch.Tensor | None   # [seqs, context_len, 1, 1] True past a context's end
    mask: torch.Tensor | None    # [seqs, 1, group * max_query_len, context_len] True = seen
    query_rows: torch.Tensor | None    # [seqs * max_query_len] row of q of each padded query
    out_rows: torch.Tensor | None      # rows of the output the real padded queries fill
    out_select: torch.Tensor | None    # and which padded queries they are


class FastTorchAttentionBackend:
    name = "torch"

    def write_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_slots(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        group = q.shape[1] // kv_heads
        key = ("torch_fast", group)
        if key not in meta.derived:
            meta.derived[key] = step_layout(meta, group, k_cache.shape[1], q.shape[0], q.device)
        layout = meta.derived[key]
        if layout.seqs == 0:
            return torch.zeros_like(q)
        k = gather_contexts(k_cache, layout).to(q.dtype)
        v = gather_contexts(v_cache, layout).to(q.dtype)
        padded = q if layout.query_rows is None else q.index_select(0, layout.query_rows)
        seqs, q_len = layout.seqs, layout.max_query_len
        # [seqs * q_len, kv_heads * group, d] -> [seqs, kv_heads, group * q_len, d]
        qg = padded.view(seqs, q_len, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        o = F.scaled_dot_product_attention(qg.reshape(seqs, kv_heads, group * q_len, head_dim),
                                           k, v, attn_mask=layout.mask, scale=scale)
        o = o.view(seqs, kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
        o = o.reshape(seqs * q_len, q.shape[1], head_dim)
        if layout.out_rows is None:
            return o
        out = torch.zeros_like(q)
        return out.index_copy_(0, layout.out_rows, o.index_select(0, layout.out_select))


def gather_contexts(cache: torch.Tensor, layout: StepLayout) -> torch.Tensor:
    """[seqs, kv_heads, context_len, d] of the step's contexts, zeros past each one's end
    (a pool slot past it may hold anything, NaN included)."""
    rows = cache.index_select(0, layout.blocks)
    rows = rows.view(layout.seqs, -1, *cache.shape[2:])[:, :layout.context_len]
    if layout.key_padding is not None:
        rows = rows.masked_fill(layout.key_padding, 0)
    return rows.transpose(1, 2)


def step_layout(meta: AttentionMetadata, group: int, block_size: int, num_tokens: int,
                device: torch.device) -> StepLayout:
    starts, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    live = [i for i in range(len(seq_lens)) if starts[i + 1] > starts[i]]
    q_lens = [starts[i + 1] - starts[i] for i in live]
    lens = [seq_lens[i] for i in live]
    if not live:
        return StepLayout(0, 0, 0, *(None,) * 6)
    max_q, context_len = max(q_lens), max(lens)
    blocks_per_seq = -(-context_len // block_size)
    tables = meta.block_tables[live] if len(live) < len(seq_lens) else meta.block_tables
    blocks = tables[:, :blocks_per_seq].long().flatten().to(device)
    key_pos = torch.arange(context_len, device=device)
    lens_t = torch.tensor(lens, device=device)
    key_padding = None
    if min(lens) < context_len:
        key_padding = (key_pos[None, :] >= lens_t[:, None])[:, :, None, None]
    query_pos = (lens_t - torch.tensor(q_lens, device=device))[:, None] + torch.arange(
        max_q, device=device)  # [seqs, max_q]; padded queries sit past their context
    mask = None
    if max_q > 1 or key_padding is not None:
        seen = (key_pos[None, None, :] <= query_pos[:, :, None]) & (
            key_pos[None, None, :] < lens_t[:, None, None])
        mask = seen[:, None].repeat(1, 1, group, 1)
    flat_starts = torch.tensor([starts[i] for i in live], device=device)
    padded_rows = flat_starts[:, None] + torch.arange(max_q, device=device)
    is_real = torch.arange(max_q, device=device)[None, :] < torch.tensor(q_lens, device=device)[:, None]
    identity = all(q == max_q for q in q_lens) and num_tokens == len(live) * max_q and \
        all(starts[i] == j * max_q for j, i in enumerate(live))
    if identity:
        return StepLayout(len(live), max_q, context_len, blocks, key_padding, mask, None, None,
                          None)
    query_rows = padded_rows.clamp(max=max(num_tokens - 1, 0)).flatten()
    out_select = is_real.flatten().nonzero().flatten()
    return StepLayout(len(live), max_q, context_len, blocks, key_padding, mask, query_rows,
                      padded_rows.flatten()[out_select], out_select)
