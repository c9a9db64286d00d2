"""Attention in plain PyTorch, fast on the CPU: all the sequences of a step in one SDPA call
per layer (`torch_ref` is the per-sequence reference it is tested against).

The step's contexts are gathered from the paged pool padded to the longest
([seqs, kv_heads, context_len, d]); its queries padded to the longest query and laid out
per KV head ([seqs, kv_heads, group * max_query_len, d]: the heads sharing a KV head side
by side, so GQA needs no expanded K/V); one additive mask says which positions each query
sees. A padded key position reads its own sequence's first slot (masked out; never another
request's data, which could hold anything). A step mixing decodes with prompt chunks attends
its decodes in a call of their own (padded to the chunks' length they would cost as many
queries as a chunk). The slots, indices and mask depend only on the step, so the first layer
builds them and the others reuse them from the metadata."""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_decode_contexts import DecodeContexts, holds

# a step's decodes are attended apart from its prompt chunks when these are this long
SPLIT_QUERY_LEN = 8


@dataclass
class StepLayout:
    """Where a step's queries and keys sit in the padded batch."""
    seqs: int
    max_query_len: int
    key_slots: torch.Tensor | None     # [seqs * context_len] pool slot of each padded key
    seen: torch.Tensor | None          # [seqs, 1, group * max_query_len, context_len] bool
    query_rows: torch.Tensor | None    # [seqs * max_query_len] row of q of each padded query
    out_rows: torch.Tensor | None      # rows of the output the real padded queries fill
    out_select: torch.Tensor | None    # and which padded queries they are
    masks: dict = field(default_factory=dict)  # dtype -> `seen` as 0 / -inf
    key_run: int | None = None  # one sequence whose context is one run of slots from here
    holdable: bool = False  # a decode of every sequence: its contexts may be held (DecodeContexts)

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.seen is None:
            return None
        if dtype not in self.masks:
            zeros = torch.zeros(self.seen.shape, dtype=dtype, device=self.seen.device)
            self.masks[dtype] = zeros.masked_fill_(~self.seen, float("-inf"))
        return self.masks[dtype]


@dataclass
class SlotWrites:
    rows: torch.Tensor | None  # rows of k/v that have a slot (None: all of them)
    slots: torch.Tensor


class FastTorchAttentionBackend:
    name = "torch"

    def __init__(self):
        self.held = DecodeContexts()

    def write_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        if "torch_fast_writes" not in meta.derived:
            meta.derived["torch_fast_writes"] = slot_writes(meta.slot_mapping)
        writes = meta.derived["torch_fast_writes"]
        if writes.rows is not None:
            k, v = k.index_select(0, writes.rows), v.index_select(0, writes.rows)
        for new, cache in ((k, k_cache), (v, v_cache)):
            new = new if new.dtype == cache.dtype else new.to(cache.dtype)
            rows = cache.view(-1, *cache.shape[2:])
            if cache.element_size() == 1:  # FP8: the CPU copies its bytes (no float8 kernel)
                new, rows = new.view(torch.uint8), rows.view(torch.uint8)
            rows.index_copy_(0, writes.slots, new)
        if holds(k_cache):
            self.held.write(k.to(k_cache.dtype), v.to(v_cache.dtype), k_cache, meta)

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        kv_heads = k_cache.shape[2]
        group = q.shape[1] // kv_heads
        key = ("torch_fast", group)
        if key not in meta.derived:
            meta.derived[key] = step_layouts(meta, group, q.shape[0], q.device)
        layouts = meta.derived[key]
        if len(layouts) == 1 and layouts[0].out_rows is None:
            return attend_padded(q, k_cache, v_cache, layouts[0], scale, self.contexts(
                k_cache, v_cache, layouts[0], meta))
        out = torch.zeros_like(q)
        for layout in layouts:
            o = attend_padded(q, k_cache, v_cache, layout, scale)
            out.index_copy_(0, layout.out_rows, o.index_select(0, layout.out_select))
        return out

    def contexts(self, k_cache, v_cache, layout: StepLayout, meta: AttentionMetadata):
        """The held contexts of a decode of every sequence, else None (gathered)."""
        if not layout.holdable or not holds(k_cache):
            return None
        return self.held.contexts(k_cache, v_cache, layout.key_slots, meta)


def attend_padded(q, k_cache, v_cache, layout: StepLayout, scale: float,
                  contexts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """[seqs * max_query_len, heads, d]: the layout's sequences' queries, padded; the keys
    and values `contexts` where given, else gathered from the pool."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    group = q.shape[1] // kv_heads
    seqs, q_len = layout.seqs, layout.max_query_len
    k, v = contexts or (gather_contexts(cache, layout, seqs) for cache in (k_cache, v_cache))
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    padded = q if layout.query_rows is None else q.index_select(0, layout.query_rows)
    mask = layout.mask(q.dtype)
    if q_len == 1 and seqs == 1 and mask is None:
        # a lone sequence's decode: one query a head, the KV heads shared by SDPA, faster than
        # [1, kv_heads, group, d] (SmolLM2's layer at ~100 keys, one thread: 31 -> 24 us)
        o = F.scaled_dot_product_attention(padded.view(1, q.shape[1], 1, head_dim), k, v,
                                           scale=scale, enable_gqa=True)
        return o.view(1, q.shape[1], head_dim)
    if q_len == 1:  # a query a sequence: [seqs, kv_heads * group, d] is [seqs, kv_heads, group, d]
        o = F.scaled_dot_product_attention(padded.view(seqs, kv_heads, group, head_dim), k, v,
                                           attn_mask=mask, scale=scale)
        return o.reshape(seqs, q.shape[1], head_dim)
    # [seqs * q_len, kv_heads * group, d] -> [seqs, kv_heads, group * q_len, d]
    qg = padded.view(seqs, q_len, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    o = F.scaled_dot_product_attention(qg.reshape(seqs, kv_heads, group * q_len, head_dim),
                                       k, v, attn_mask=mask, scale=scale)
    o = o.view(seqs, kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(seqs * q_len, q.shape[1], head_dim)


def gather_contexts(cache: torch.Tensor, layout: StepLayout, seqs: int) -> torch.Tensor:
    """[seqs, kv_heads, context_len, d] of the step's contexts (a view of the pool where
    they are one run of slots)."""
    slots = cache.view(-1, *cache.shape[2:])
    if layout.key_run is not None:
        rows = slots[layout.key_run:layout.key_run + layout.key_slots.shape[0]]
    else:
        rows = slots.index_select(0, layout.key_slots)
    return rows.view(seqs, -1, *cache.shape[2:]).transpose(1, 2)


def slot_writes(slot_mapping: torch.Tensor) -> SlotWrites:
    valid = slot_mapping >= 0
    if bool(valid.all()):
        return SlotWrites(None, slot_mapping.long())
    rows = valid.nonzero().flatten()
    return SlotWrites(rows, slot_mapping.long()[rows])


def slot_run(meta: AttentionMetadata, live: list[int], context_len: int) -> int | None:
    """The first slot of a lone CPU sequence's context where its blocks are one ascending
    run (a fresh engine's blocks are handed out in order), else None."""
    if len(live) != 1 or meta.block_tables.device.type != "cpu":
        return None
    blocks = meta.block_tables[live[0], :-(-context_len // meta.block_size)].tolist()
    if blocks != list(range(blocks[0], blocks[0] + len(blocks))):
        return None
    return blocks[0] * meta.block_size


def step_layouts(meta: AttentionMetadata, group: int, num_tokens: int,
                 device: torch.device) -> list[StepLayout]:
    """One layout for the step's sequences with queries, or two where decodes meet prompt
    chunks: the single-query sequences, then the others."""
    starts = meta.query_start_loc_cpu
    live = [i for i in range(len(meta.seq_lens_cpu)) if starts[i + 1] > starts[i]]
    single = [i for i in live if starts[i + 1] - starts[i] == 1]
    longest = max((starts[i + 1] - starts[i] for i in live), default=0)
    if not single or len(single) == len(live) or longest < SPLIT_QUERY_LEN:
        return [step_layout(meta, live, group, num_tokens, device)] if live else []
    longer = [i for i in live if starts[i + 1] - starts[i] > 1]
    return [step_layout(meta, part, group, num_tokens, device) for part in (single, longer)]


def step_layout(meta: AttentionMetadata, live: list[int], group: int, num_tokens: int,
                device: torch.device) -> StepLayout:
    """The padded batch of sequences `live` (each with at least one query)."""
    starts, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    q_lens = [starts[i + 1] - starts[i] for i in live]
    lens = torch.tensor([seq_lens[i] for i in live], device=device)
    max_q, context_len = max(q_lens), max(seq_lens[i] for i in live)
    key_pos = torch.arange(context_len, device=device)
    query_pos = torch.arange(max_q, device=device)
    q_lens_t = torch.tensor(q_lens, device=device)
    in_context = key_pos[None, :] < lens[:, None]
    tables = meta.block_tables[live].long() if len(live) < len(seq_lens) else \
        meta.block_tables.long()
    slots = tables[:, key_pos // meta.block_size] * meta.block_size + key_pos % meta.block_size
    key_slots = torch.where(in_context, slots, slots[:, :1]).flatten()
    seen = None
    if max_q > 1 or not bool(in_context.all()):
        # padded queries sit past their context's end: they see all of it, nothing else
        position = (lens - q_lens_t)[:, None] + query_pos  # [seqs, max_q]
        causal = key_pos[None, None, :] <= position[:, :, None]
        seen = (causal & in_context[:, None, :])[:, None].repeat(1, 1, group, 1)
    identity = all(q == max_q for q in q_lens) and num_tokens == len(live) * max_q and all(
        starts[i] == j * max_q for j, i in enumerate(live))
    if identity:
        key_run = slot_run(meta, live, context_len)
        holdable = max_q == 1 and key_run is None and len(live) == len(seq_lens) > 1
        return StepLayout(len(live), max_q, key_slots, seen, None, None, None,
                          key_run=key_run, holdable=holdable)
    padded_rows = torch.tensor([starts[i] for i in live], device=device)[:, None] + query_pos
    is_real = (query_pos[None, :] < q_lens_t[:, None]).flatten()
    out_select = is_real.nonzero().flatten()
    return StepLayout(len(live), max_q, key_slots, seen,
                      padded_rows.clamp(max=num_tokens - 1).flatten(),
                      padded_rows.flatten()[out_select], out_select)
