"""A plan's view of the KV pool: the same bytes, blocks of more tokens of fewer heads."""
import pytest
import torch

from parashift.kv.views import kv_heads_per_rank, tokens_per_block, view_pool
from parashift.parallel.plan import Plan


def test_a_merged_plan_reads_blocks_of_w_times_the_tokens():
    single, merged = Plan(), Plan.parse("merge2-tp2")
    assert kv_heads_per_rank(single, 4) == 4 and kv_heads_per_rank(merged, 4) == 2
    assert tokens_per_block(merged, single, 4, 16) == 32
    assert tokens_per_block(Plan.parse("merge4-tp4"), single, 4, 16) == 64
    assert tokens_per_block(single, single, 4, 16) == 16
    # 2 KV heads over 4 ranks: each holds one (replicated), so blocks hold 2x the tokens
    assert tokens_per_block(Plan.parse("merge4-tp4"), single, 2, 16) == 32


def test_a_view_shares_the_pool_bytes():
    pool = torch.arange(2 * 3 * 16 * 4 * 8, dtype=torch.float32).view(2, 3, 16, 4, 8)
    view = view_pool(pool, 32)
    assert view.shape == (2, 3, 32, 2, 8) and view.data_ptr() == pool.data_ptr()
    view[1, 2].fill_(-1)  # one block of the view is one block of the pool
    assert (pool[1, 2] == -1).all() and (pool[1, :2] >= 0).all()


def test_a_plan_with_more_heads_per_rank_than_the_pool_has_no_view():
    with pytest.raises(ValueError, match="no view of the pool fits"):
        tokens_per_block(Plan(), Plan(tp=2), 4, 16)
