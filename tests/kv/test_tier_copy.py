"""gather then scatter through a CPU KV tier slot round-trips a rank's slice bit for bit
(a TP rank's heads, a PP rank's layers; ragged lengths; slots away from offset 0), touches
nothing outside the slot and the request's pages, and copies by contiguous host runs."""
import random

import pytest
import torch

from parashift.kv.cpu_tier import CpuKVTier, TierShape
from parashift.kv.tier_allocator import TierSlot
from parashift.kv.tier_copy import (KVSlice, _contiguous_runs, _tier_view, gather, scatter,
                                    token_slots, wait_for_copies)

LAYERS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 6, 4, 8, 4, 24
TIER_TOKENS = 64
SLICES = {"tp-rank-1-of-2": KVSlice(range(0, LAYERS), range(2, 4)),
          "pp-rank-1-of-2": KVSlice(range(3, LAYERS), range(0, KV_HEADS))}


def _pools(kv_slice: KVSlice, fill):
    shape = (len(kv_slice.layers), BLOCKS, BLOCK, len(kv_slice.heads), HEAD_DIM)
    return fill(shape), fill(shape)


def _table(num_tokens: int, rng: random.Random) -> list[int]:
    return rng.sample(range(BLOCKS), -(-num_tokens // BLOCK))


def _read(pool: torch.Tensor, table: list[int], num_tokens: int) -> torch.Tensor:
    return pool.flatten(1, 2)[:, token_slots(table, num_tokens, BLOCK, pool.device)]


@pytest.mark.parametrize("slice_name", SLICES)
@pytest.mark.parametrize("num_tokens, slot_start", [(1, 7), (5, 13), (12, 30), (17, 47)])
def test_gather_then_scatter_round_trips_bit_for_bit(slice_name, num_tokens, slot_start,
                                                     tmp_path):
    kv_slice, rng = SLICES[slice_name], random.Random(num_tokens)
    gen = torch.Generator().manual_seed(num_tokens)
    tier = CpuKVTier.create(TierShape(LAYERS, KV_HEADS, HEAD_DIM, torch.bfloat16), TIER_TOKENS,
                            directory=str(tmp_path))
    slot = TierSlot(slot_start, num_tokens + 3)  # a slot longer than the request
    src_k, src_v = _pools(kv_slice, lambda s: torch.randn(s, generator=gen).bfloat16())
    dst_k, dst_v = _pools(kv_slice, lambda s: torch.zeros(s, dtype=torch.bfloat16))
    src_table, dst_table = _table(num_tokens, rng), _table(num_tokens, rng)

    moved_out = gather(src_k, src_v, src_table, num_tokens, kv_slice, tier, slot)
    moved_in = scatter(tier, slot, num_tokens, kv_slice, dst_k, dst_v, dst_table)
    wait_for_copies(src_k.device)

    slice_bytes = 2 * len(kv_slice.layers) * len(kv_slice.heads) * num_tokens * HEAD_DIM * 2
    assert moved_out == moved_in == slice_bytes
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        assert torch.equal(_read(dst, dst_table, num_tokens), _read(src, src_table, num_tokens))
        untouched = torch.ones(BLOCKS * BLOCK, dtype=torch.bool)
        untouched[token_slots(dst_table, num_tokens, BLOCK, dst.device)] = False
        assert not dst.flatten(1, 2)[:, untouched].any()
    written = tier.buffer[kv_slice.layers.start:kv_slice.layers.stop, :,
                          kv_slice.heads.start:kv_slice.heads.stop,
                          slot_start:slot_start + num_tokens]
    assert tier.buffer.abs().sum() == written.abs().sum()  # nothing outside the slot
    tier.close()


def test_host_runs_are_per_layer_kv_and_head_unless_the_slot_spans_the_tier(tmp_path):
    tier = CpuKVTier.create(TierShape(LAYERS, KV_HEADS, HEAD_DIM, torch.float16), TIER_TOKENS,
                            directory=str(tmp_path))
    tp = SLICES["tp-rank-1-of-2"]
    assert len(_contiguous_runs(_tier_view(tier, tp, TierSlot(5, 9), 9))) == LAYERS * 2 * 2
    whole = KVSlice(range(0, LAYERS), range(0, KV_HEADS))
    assert _contiguous_runs(_tier_view(tier, whole, TierSlot(0, TIER_TOKENS), TIER_TOKENS)) == [()]
    assert len(_contiguous_runs(_tier_view(tier, tp, TierSlot(0, TIER_TOKENS), TIER_TOKENS))) == (
        LAYERS * 2)  # a (layer, K/V)'s two heads are one run when the slot spans the tier
    tier.close()
