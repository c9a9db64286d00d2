"""The reference backend against dense causal SDPA over non-paged copies of
the same contexts (CPU)."""
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_ref import TorchAttentionBackend


@dataclass
class Batch:
    meta: AttentionMetadata
    q: torch.Tensor            # [num_tokens, num_heads, head_dim]
    k_new: torch.Tensor        # [num_tokens, num_kv_heads, head_dim], this step's k
    v_new: torch.Tensor
    k_cache: torch.Tensor      # holds the cached prefixes; unused slots are NaN
    v_cache: torch.Tensor
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # dense k, v of each sequence


def make_batch(q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
               dtype=torch.float32, pad_tokens=0, seed=0) -> Batch:
    """Sequence i has seq_lens[i] tokens of context, the last q_lens[i] new
    this step; its blocks are a random, non-contiguous part of the pool."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq, default=1), dtype=torch.int32)
    contexts, k_rows, v_rows, slots = [], [], [], []
    used = 0
    for i, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        table = perm[used:used + blocks_per_seq[i]]
        used += blocks_per_seq[i]
        block_tables[i, :len(table)] = table.int()
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        contexts.append((k, v))
        seq_slots = table.repeat_interleave(block_size) * block_size + torch.arange(
            block_size).repeat(len(table))
        cached = seq_len - q_len
        k_cache.view(-1, num_kv_heads, head_dim)[seq_slots[:cached]] = k[:cached]
        v_cache.view(-1, num_kv_heads, head_dim)[seq_slots[:cached]] = v[:cached]
        k_rows.append(k[cached:])
        v_rows.append(v[cached:])
        slots.append(seq_slots[cached:seq_len])
    k_rows.append(torch.randn(pad_tokens, num_kv_heads, head_dim, generator=gen).to(dtype))
    v_rows.append(torch.randn(pad_tokens, num_kv_heads, head_dim, generator=gen).to(dtype))
    slots.append(torch.full((pad_tokens,), -1, dtype=torch.int64))
    num_tokens = sum(q_lens) + pad_tokens
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).long(),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables, query_start_loc_cpu=starts, seq_lens_cpu=list(seq_lens),
        max_query_len=max(q_lens, default=0), max_seq_len=max(seq_lens, default=0),
        block_size=block_size)
    return Batch(meta, q, torch.cat(k_rows), torch.cat(v_rows), k_cache, v_cache, contexts)


def dense_attention(batch: Batch, scale: float) -> torch.Tensor:
    """Each sequence's new rows, taken from full causal SDPA over its whole
    context, with the new queries as the last rows of an otherwise random q."""
    out = torch.zeros_like(batch.q)
    starts = batch.meta.query_start_loc_cpu
    num_heads = batch.q.shape[1]
    for i, (k, v) in enumerate(batch.contexts):
        qs, qe = starts[i], starts[i + 1]
        seq_len = k.shape[0]
        group = num_heads // k.shape[1]
        q_full = torch.randn(seq_len, num_heads, k.shape[2], dtype=batch.q.dtype)
        q_full[seq_len - (qe - qs):] = batch.q[qs:qe]
        o = F.scaled_dot_product_attention(
            q_full.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), is_causal=True, scale=scale)
        out[qs:qe] = o.transpose(0, 1)[seq_len - (qe - qs):]
    return out


def run_reference(batch: Batch, scale: float) -> torch.Tensor:
    backend = TorchAttentionBackend()
    backend.write_kv(batch.k_new, batch.v_new, batch.k_cache, batch.v_cache, batch.meta)
    return backend.attend(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale)


CASES = {
    "decode": ([1, 1, 1, 1], [1, 17, 64, 300]),
    "prefill": ([37, 16, 5], [37, 16, 5]),
    "chunked_prefill": ([20, 33], [70, 33 + 48]),
    "mixed": ([1, 25, 1, 9, 1], [90, 25, 1, 40, 129]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 2)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_matches_dense_sdpa(case, num_heads, num_kv_heads, block_size):
    q_lens, seq_lens = CASES[case]
    batch = make_batch(q_lens, seq_lens, num_heads, num_kv_heads, block_size=block_size)
    scale = 64 ** -0.5
    torch.testing.assert_close(run_reference(batch, scale), dense_attention(batch, scale),
                               atol=1e-5, rtol=1e-5)


def test_padding_rows_are_not_written_and_give_zeros():
    batch = make_batch([3, 1], [10, 20], pad_tokens=4)
    before_k = batch.k_cache.clone()
    out = run_reference(batch, 0.125)
    assert torch.equal(out[-4:], torch.zeros_like(out[-4:]))
    written = batch.meta.slot_mapping[batch.meta.slot_mapping >= 0]
    changed = ~torch.isclose(batch.k_cache, before_k, equal_nan=True).flatten(0, 1).all(-1).all(-1)
    assert torch.equal(changed.nonzero().flatten().sort().values, written.sort().values)


def test_write_kv_puts_new_tokens_in_their_slots():
    batch = make_batch([4], [21], num_kv_heads=2, block_size=16)
    TorchAttentionBackend().write_kv(batch.k_new, batch.v_new, batch.k_cache, batch.v_cache,
                                     batch.meta)
    k, v = batch.contexts[0]
    table = batch.meta.block_tables[0].long()
    assert torch.equal(batch.k_cache[table].flatten(0, 1)[:21], k)
    assert torch.equal(batch.v_cache[table].flatten(0, 1)[:21], v)
