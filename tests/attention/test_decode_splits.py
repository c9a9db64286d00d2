"""The split count of one-row decode launches, planned on the CPU (no kernel runs): a graph
captured for 2,048 tokens gives a lone decode splits of one KV tile, so a context of 1,025 to
2,048 tokens runs one tile a split; PARASHIFT_ATTN_SPLIT_TOKENS=128 plans as before."""
import pytest
import torch

from parashift.attention import triton_backend
from parashift.attention.metadata import AttentionMetadata
from tests.attention.test_triton_backend import make_step


def plan_for_graph(rows: int, graph_len: int, num_kv_heads: int = 8,
                   kv_dtype: torch.dtype = torch.bfloat16):
    """The plan of `rows` decodes of 1,044 tokens each in a graph captured for `graph_len`.
    A plan reads the shapes, the dtypes and the lengths, not the pool's values: the step is
    made with one token of context a sequence (a pool of 1,044 filled a row took 20 s at
    256 rows), its lengths then set to 1,044."""
    step = make_step([1] * rows, [1] * rows, 32, num_kv_heads, device="cpu")
    meta = AttentionMetadata(**{**step.meta.__dict__,
                                "seq_lens": torch.full((rows,), 1044, dtype=torch.int32),
                                "seq_lens_cpu": [graph_len] * rows,
                                "max_seq_len": graph_len, "static_shape": True})
    (seqs,) = triton_backend._split_decodes(meta, rows)
    return triton_backend._plan_launch(step.q, step.k_cache.to(kv_dtype), meta, seqs)


@pytest.mark.parametrize("rows, graph_len, splits", [(1, 2048, 32), (2, 2048, 32),
                                                     (4, 2048, 8), (1, 32768, 32)])
def test_one_row_decodes_split_by_tiles(monkeypatch, rows, graph_len, splits):
    monkeypatch.delenv(triton_backend.SPLIT_TOKENS_ENV, raising=False)
    launch = plan_for_graph(rows, graph_len)
    assert (launch.num_splits, launch.context_splits) == (splits, launch.config.tile_n)
    assert launch.config.tile_n == 64  # bf16 heads of 128: the tile the splits are cut by


def test_split_tokens_switch(monkeypatch):
    monkeypatch.setenv(triton_backend.SPLIT_TOKENS_ENV, "128")
    assert plan_for_graph(1, 2048).num_splits == 16
    monkeypatch.setenv(triton_backend.SPLIT_TOKENS_ENV, "tile")
    with pytest.raises(ValueError, match="SPLIT_TOKENS"):
        plan_for_graph(1, 2048)


def test_choose_num_splits_by_min_split_tokens():
    """Other launches' splits are still of MIN_SPLIT_TOKENS at least."""
    assert triton_backend.choose_num_splits(8, 2048, 1, 132) == 16
    assert triton_backend.choose_num_splits(8, 2048, 1, 132, 64) == 32


@pytest.mark.parametrize("rows, kv_dtype, pairs, stages", [
    (64, "float8_e4m3fn", "1", 3), (256, "float8_e4m3fn", "1", 2), (64, "float8_e4m3fn", "0", 2),
    (64, "bfloat16", "1", 2)])
def test_fp8_pairs_stages(monkeypatch, rows, kv_dtype, pairs, stages):
    """The one-launch kernel over an FP8 pool read as pairs takes 3 stages where its launch has
    few programs an SM (8B heads: 64 rows, 3.9 on 132 SMs), else 2 as over bf16."""
    monkeypatch.setenv(triton_backend.FP8_PAIRS_ENV, pairs)
    launch = plan_for_graph(rows, 2048, kv_dtype=getattr(torch, kv_dtype))
    assert launch.fused and launch.config.num_stages == stages
