import pytest

from parashift.engine.sequence import Sequence
from parashift.kv.block_manager import BlockManager, hash_block
from parashift.sampling_params import SamplingParams

BS = 4


def make_seq(token_ids, request_id="r"):
    return Sequence(request_id, list(token_ids), SamplingParams())


def run_prefill(bm, seq):
    """Allocate, 'compute' and cache a whole prompt, as one scheduler step would."""
    blocks, num_cached = bm.get_computed_blocks(seq)
    assert bm.allocate_slots(seq, seq.num_tokens - num_cached, blocks)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq, seq.num_computed_tokens)


def test_fresh_blocks_are_handed_out_in_order():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = make_seq(range(10), "a"), make_seq(range(50, 54), "b")
    assert bm.allocate_slots(a, 10)
    assert bm.allocate_slots(b, 4)
    assert a.block_table == [0, 1, 2]
    assert b.block_table == [3]
    assert bm.ref_counts[:5] == [1, 1, 1, 1, 0]
    assert (bm.num_free_blocks, bm.num_used_blocks) == (4, 4)
    assert bm.usage == 0.5


def test_allocate_grows_only_when_a_block_fills():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq(range(3))
    assert bm.allocate_slots(seq, 3)
    seq.num_computed_tokens = 3
    seq.append_token(3)
    assert bm.allocate_slots(seq, 1)
    assert seq.block_table == [0]
    seq.num_computed_tokens = 4
    seq.append_token(4)
    assert bm.allocate_slots(seq, 1)
    assert seq.block_table == [0, 1]


def test_allocation_failure_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a, b = make_seq(range(12), "a"), make_seq(range(100, 108), "b")
    assert bm.allocate_slots(a, 12)
    queue_before = list(bm.free_queue)
    assert not bm.allocate_slots(b, 8)
    assert b.block_table == [] and b.block_hashes == []
    assert list(bm.free_queue) == queue_before == [3]
    assert bm.ref_counts == [1, 1, 1, 0]


def test_failure_with_computed_blocks_leaves_cache_untouched():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = make_seq(range(9), "a")
    run_prefill(bm, a)
    bm.free(a)
    assert list(bm.free_queue) == [2, 1, 0]
    b = make_seq(range(9), "b")
    blocks, num_cached = bm.get_computed_blocks(b)
    assert (blocks, num_cached) == ([0, 1], 8)
    # 8 cached + 5 new = 13 tokens = 4 blocks > 3 in the pool
    assert not bm.allocate_slots(b, 5, blocks)
    assert list(bm.free_queue) == [2, 1, 0]
    assert bm.ref_counts == [0, 0, 0]
    assert b.block_table == []
    # Reviving the 2 cached blocks leaves exactly 1 fresh block: fits.
    assert bm.allocate_slots(b, 1, blocks)
    assert b.block_table == [0, 1, 2]
    assert bm.num_free_blocks == 0


def test_free_returns_tail_first_and_fresh_blocks_reuse_lru_order():
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=False)
    a, b = make_seq(range(12), "a"), make_seq(range(8), "b")
    assert bm.allocate_slots(a, 12) and bm.allocate_slots(b, 8)
    assert (a.block_table, b.block_table) == ([0, 1, 2], [3, 4])
    bm.free(a)
    assert list(bm.free_queue) == [5, 2, 1, 0]
    bm.free(b)
    assert list(bm.free_queue) == [5, 2, 1, 0, 4, 3]
    assert a.block_table == [] and b.block_table == []
    c = make_seq(range(16), "c")
    assert bm.allocate_slots(c, 16)
    assert c.block_table == [5, 2, 1, 0]
    assert list(bm.free_queue) == [4, 3]


def test_prefix_hit_returns_and_shares_exact_blocks():
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = make_seq(range(10), "a")
    run_prefill(bm, a)
    assert a.block_table == [0, 1, 2]
    assert len(a.block_hashes) == 2
    b = make_seq(range(10), "b")
    blocks, num_cached = bm.get_computed_blocks(b)
    assert (blocks, num_cached) == ([0, 1], 8)
    assert bm.ref_counts[:3] == [1, 1, 1]  # lookup alone changes nothing
    assert bm.allocate_slots(b, 2, blocks)
    assert b.block_table == [0, 1, 3]
    assert bm.ref_counts[:4] == [2, 2, 1, 1]
    assert b.block_hashes == a.block_hashes
    bm.free(a)
    assert bm.ref_counts[:4] == [1, 1, 0, 1]
    assert list(bm.free_queue)[-1] == 2


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    bm = BlockManager(num_blocks=10, block_size=BS)
    run_prefill(bm, make_seq(range(12), "a"))
    assert bm.get_computed_blocks(make_seq(range(8), "b")) == ([0], 4)
    assert bm.get_computed_blocks(make_seq(range(9), "c")) == ([0, 1], 8)
    assert bm.get_computed_blocks(make_seq(range(12), "d")) == ([0, 1], 8)
    assert bm.get_computed_blocks(make_seq(range(4), "e")) == ([], 0)


def test_prefix_hit_is_chained_and_stops_at_first_miss():
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = make_seq(range(13), "a")
    run_prefill(bm, a)
    # same first block, different second block, same third block
    b = make_seq([0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12], "b")
    assert bm.get_computed_blocks(b) == ([0], 4)
    # second block equal to a's, but after a different first block
    c = make_seq([7, 7, 7, 7, 4, 5, 6, 7, 8], "c")
    assert bm.get_computed_blocks(c) == ([], 0)
    expected = hash_block(hash_block(None, [0, 1, 2, 3]), [4, 5, 6, 7])
    assert a.block_hashes[1] == expected


def test_freed_blocks_stay_cached_and_leave_the_free_queue_on_hit():
    bm = BlockManager(num_blocks=6, block_size=BS)
    a = make_seq(range(9), "a")
    run_prefill(bm, a)
    bm.free(a)
    assert list(bm.free_queue) == [3, 4, 5, 2, 1, 0]
    assert bm.num_free_blocks == 6
    b = make_seq(range(9), "b")
    run_prefill(bm, b)
    assert b.block_table == [0, 1, 3]
    assert list(bm.free_queue) == [4, 5, 2]
    assert bm.ref_counts == [1, 1, 0, 1, 0, 0]


def test_taking_a_cached_block_as_fresh_evicts_its_hash():
    bm = BlockManager(num_blocks=5, block_size=BS)
    a = make_seq(range(9), "a")
    run_prefill(bm, a)
    first_hash, second_hash = a.block_hashes
    bm.free(a)
    assert list(bm.free_queue) == [3, 4, 2, 1, 0]
    c = make_seq(range(100, 116), "c")
    assert bm.allocate_slots(c, 16)
    assert c.block_table == [3, 4, 2, 1]
    assert second_hash not in bm.hash_to_block
    assert bm.block_hash[1] is None
    assert bm.hash_to_block == {first_hash: 0}
    assert bm.get_computed_blocks(make_seq(range(9), "b")) == ([0], 4)


def test_duplicate_content_stays_unregistered():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = make_seq(range(9), "a"), make_seq(range(9), "b")
    assert bm.allocate_slots(a, 9) and bm.allocate_slots(b, 9)
    for seq in (a, b):
        seq.num_computed_tokens = 9
        bm.cache_full_blocks(seq, 9)
    assert (a.block_table, b.block_table) == ([0, 1, 2], [3, 4, 5])
    assert b.block_hashes == a.block_hashes
    assert sorted(bm.hash_to_block.values()) == [0, 1]
    assert bm.block_hash[3] is None and bm.block_hash[4] is None
    bm.free(b)
    assert bm.get_computed_blocks(make_seq(range(9), "c")) == ([0, 1], 8)


def test_cache_full_blocks_registers_only_complete_blocks_incrementally():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq(range(10))
    assert bm.allocate_slots(seq, 3)
    bm.cache_full_blocks(seq, 3)
    assert seq.block_hashes == []
    assert bm.allocate_slots(seq, 6)  # computed 0, now covers 9 tokens
    bm.cache_full_blocks(seq, 9)
    h0 = hash_block(None, [0, 1, 2, 3])
    h1 = hash_block(h0, [4, 5, 6, 7])
    assert seq.block_hashes == [h0, h1]
    assert bm.hash_to_block == {h0: 0, h1: 1}
    bm.cache_full_blocks(seq, 10)
    assert seq.block_hashes == [h0, h1]


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = make_seq(range(9), "a")
    run_prefill(bm, a)
    assert a.block_hashes == [] and bm.hash_to_block == {}
    assert bm.get_computed_blocks(make_seq(range(9), "b")) == ([], 0)


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_rejects_empty_pool_or_block(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)


# ---- managers sharing one pool (the KV adaptor) ---------------------------------

def test_a_merged_manager_starts_with_the_blocks_no_replica_uses():
    rank0, rank1 = (BlockManager(8, BS, ranks=(r,)) for r in (0, 1))
    a, b = make_seq(range(6), "a"), make_seq(range(3), "b")
    assert rank0.allocate_slots(a, 6) and rank1.allocate_slots(b, 3)
    merged = BlockManager(8, 2 * BS, ranks=(0, 1))
    merged.share([rank0, rank1])
    assert list(merged.free_queue) == [2, 3, 4, 5, 6, 7]  # 0, 1 on rank 0; 0 on rank 1
    c = make_seq(range(20), "c")
    assert merged.allocate_slots(c, 20)
    assert c.block_table == [2, 3, 4]
    assert list(rank0.free_queue) == [5, 6, 7] and list(rank1.free_queue) == [1, 5, 6, 7]


def test_blocks_freed_by_one_sharer_return_to_the_others_once_no_one_uses_them():
    rank0, rank1 = (BlockManager(4, BS, ranks=(r,)) for r in (0, 1))
    a, b = make_seq(range(4), "a"), make_seq(range(4), "b")
    assert rank0.allocate_slots(a, 4) and rank1.allocate_slots(b, 4)  # block 0 on each
    merged = BlockManager(4, 2 * BS, ranks=(0, 1))
    merged.share([rank0, rank1])
    rank0.free(a)
    assert 0 not in merged.free_queue  # rank 1 still uses block 0
    rank1.free(b)
    assert list(merged.free_queue) == [1, 2, 3, 0]
    c = make_seq(range(8 * 4), "c")
    assert merged.allocate_slots(c, 32)
    assert c.block_table == [1, 2, 3, 0] and not rank0.free_queue and not rank1.free_queue
    merged.free(c)
    assert list(rank0.free_queue) == [0, 3, 2, 1]  # tail first, as it frees them


def test_a_block_taken_by_a_sharer_leaves_the_others_prefix_cache():
    rank0 = BlockManager(3, BS, ranks=(0,))
    a = make_seq(range(8), "a")
    run_prefill(rank0, a)
    rank0.free(a)
    assert rank0.hash_to_block  # blocks 0 and 1 cached
    merged = BlockManager(3, 2 * BS, ranks=(0, 1))
    merged.share([rank0])
    c = make_seq(range(100, 105), "c")
    assert merged.allocate_slots(c, 5)
    assert c.block_table == [0]
    assert list(rank0.hash_to_block.values()) == [1] and rank0.block_hash[0] is None
    again = make_seq(range(9), "again")  # would hit blocks 0 and 1
    assert rank0.get_computed_blocks(again) == ([], 0)  # its chain starts with block 0


def test_managers_of_other_ranks_or_block_ranges_do_not_share():
    first, second = BlockManager(4, BS, ranks=(0, 1)), BlockManager(4, BS, ranks=(0, 1), offset=4)
    other_rank = BlockManager(4, BS, ranks=(2,))
    first.share([second, other_rank])
    assert first.sharing == [] and second.sharing == []


def test_unshare_needs_every_block_freed():
    rank0, merged = BlockManager(4, BS, ranks=(0,)), BlockManager(4, BS, ranks=(0, 1))
    merged.share([rank0])
    a = make_seq(range(3), "a")
    assert rank0.allocate_slots(a, 3)
    with pytest.raises(AssertionError):
        rank0.unshare()
    rank0.free(a)
    rank0.unshare()
    assert merged.sharing == [] and list(merged.free_queue) == [1, 2, 3, 0]
