"""The batched CPU backend against the per-sequence reference (torch_ref) on the same
paged steps: decodes of unequal lengths, prompts, chunked prefill against a cached prefix,
mixed steps, padding rows, GQA ratios, block sizes and dtypes."""
import pytest
import torch

from parashift.attention.backend import get_backend
from parashift.attention.torch_fast import FastTorchAttentionBackend
from parashift.attention.torch_ref import TorchAttentionBackend
from tests.attention.test_torch_ref import CASES, make_batch

MORE_CASES = {
    "equal_decodes": ([1, 1, 1], [40, 40, 40]),
    "equal_prompts": ([12, 12], [12, 12]),
    "one_prompt": ([29], [29]),
    "empty_sequence": ([3, 0, 1], [3, 7, 9]),
    "decodes_beside_chunks": ([1, 40, 1, 1, 0, 12], [77, 40, 3, 130, 5, 50]),
}


def attend(backend, batch, scale):
    """The backend's output on a fresh copy of the batch's pool."""
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    backend.write_kv(batch.k_new, batch.v_new, k_cache, v_cache, batch.meta)
    return backend.attend(batch.q, k_cache, v_cache, batch.meta, scale)


@pytest.mark.parametrize("case", {**CASES, **MORE_CASES})
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (9, 3)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_matches_reference(case, num_heads, num_kv_heads, block_size):
    q_lens, seq_lens = {**CASES, **MORE_CASES}[case]
    batch = make_batch(q_lens, seq_lens, num_heads, num_kv_heads, block_size=block_size)
    expected = attend(TorchAttentionBackend(), batch, 0.125)
    got = attend(FastTorchAttentionBackend(), batch, 0.125)
    assert not got.isnan().any()  # the pool's unused slots are NaN: none may be read
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_reference(dtype):
    batch = make_batch(*CASES["mixed"], 6, 2, dtype=dtype)
    torch.testing.assert_close(attend(FastTorchAttentionBackend(), batch, 0.125),
                               attend(TorchAttentionBackend(), batch, 0.125),
                               atol=2e-2, rtol=2e-2)


def test_padding_rows_give_zeros_and_every_layer_reuses_the_step_layout():
    batch = make_batch([3, 1], [10, 20], pad_tokens=4)
    backend = FastTorchAttentionBackend()
    first = attend(backend, batch, 0.125)
    assert torch.equal(first[-4:], torch.zeros_like(first[-4:]))
    layout = batch.meta.derived[("torch_fast", 2)]
    assert torch.equal(attend(backend, batch, 0.125), first)
    assert batch.meta.derived[("torch_fast", 2)] is layout


def test_a_mixed_step_attends_its_decodes_apart_from_its_prompt_chunks():
    """Decodes padded to a 40-token chunk would cost 40 queries each: they get a call of
    their own, and the output is the reference's row for row (padding rows zero)."""
    batch = make_batch([1, 40, 1, 0, 9], [77, 40, 3, 5, 60], 6, 2, pad_tokens=3)
    got = attend(FastTorchAttentionBackend(), batch, 0.125)
    decodes, chunks = batch.meta.derived[("torch_fast", 3)]
    assert (decodes.seqs, decodes.max_query_len, chunks.seqs, chunks.max_query_len) == (2, 1, 2, 40)
    torch.testing.assert_close(got, attend(TorchAttentionBackend(), batch, 0.125),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(got[-3:], torch.zeros_like(got[-3:]))


def on_one_run_of_blocks(batch, first_block: int):
    """The batch with its lone sequence's blocks moved to first_block, first_block + 1, ..."""
    meta, block_size = batch.meta, batch.meta.block_size
    table = meta.block_tables[0].long()
    run = torch.arange(first_block, first_block + len(table))
    for cache in (batch.k_cache, batch.v_cache):
        moved = torch.full_like(cache, float("nan"))
        moved[run] = cache[table]
        cache.copy_(moved)
    position = (meta.slot_mapping // block_size)[:, None] == table[None, :]
    meta.slot_mapping = run[position.int().argmax(1)] * block_size + \
        meta.slot_mapping % block_size
    meta.block_tables[0] = run.int()
    return batch


@pytest.mark.parametrize("q_len", [1, 5])
def test_a_lone_sequence_on_one_run_of_blocks_is_read_in_place(q_len):
    scattered = make_batch([q_len], [70], 9, 3)
    attend(FastTorchAttentionBackend(), scattered, 0.125)
    assert scattered.meta.derived[("torch_fast", 3)][0].key_run is None
    batch = on_one_run_of_blocks(make_batch([q_len], [70], 9, 3), first_block=2)
    got = attend(FastTorchAttentionBackend(), batch, 0.125)
    assert batch.meta.derived[("torch_fast", 3)][0].key_run == 2 * batch.meta.block_size
    assert not got.isnan().any()
    torch.testing.assert_close(got, attend(TorchAttentionBackend(), batch, 0.125),
                               atol=1e-5, rtol=1e-5)


def test_backend_names():
    cpu = torch.device("cpu")
    assert isinstance(get_backend("torch", cpu), FastTorchAttentionBackend)
    assert isinstance(get_backend("auto", cpu), FastTorchAttentionBackend)
    assert type(get_backend("torch-ref", cpu)) is TorchAttentionBackend
    with pytest.raises(ValueError, match="not batch-invariant"):
        get_backend("torch-ref", cpu, deterministic=True)


def test_write_kv_fills_the_same_slots_as_the_reference():
    batch = make_batch([3, 1, 5], [10, 20, 5], pad_tokens=4)
    pools = []
    for backend in (TorchAttentionBackend(), FastTorchAttentionBackend()):
        k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
        backend.write_kv(batch.k_new, batch.v_new, k_cache, v_cache, batch.meta)
        pools.append((k_cache, v_cache))
    for ref, fast in zip(*pools):
        assert torch.equal(ref.isnan(), fast.isnan())
        assert torch.equal(ref.nan_to_num(), fast.nan_to_num())
