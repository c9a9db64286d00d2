"""The CPU backend's held decode contexts (attention/torch_decode_contexts.py): a chain of
decode steps attends with the same bits as a backend that gathers every step, and anything
that breaks the chain (a step between, a sequence leaving, a block moved) regathers."""
import pytest
import torch

from parashift.attention import torch_decode_contexts
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_fast import FastTorchAttentionBackend
from parashift.attention.torch_ref import TorchAttentionBackend

KV_HEADS, HEADS, HEAD_DIM, BLOCK = 3, 9, 64, 16


class Pool:
    """A paged pool whose unused slots are NaN, sequences growing a token a step on blocks
    handed out in a shuffled order."""

    def __init__(self, lens: list[int], dtype=torch.bfloat16, blocks=64, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        shape = (blocks, BLOCK, KV_HEADS, HEAD_DIM)
        self.k = torch.full(shape, float("nan"), dtype=dtype)
        self.v = torch.full(shape, float("nan"), dtype=dtype)
        self.free = torch.randperm(blocks, generator=self.gen).tolist()
        self.tables = [[] for _ in lens]
        self.lens = [0] * len(lens)
        self.dtype = dtype
        for i, n in enumerate(lens):  # the prompts, written straight into the pool
            for _ in range(n):
                slot = self.grow(i)
                for cache in (self.k, self.v):
                    cache.view(-1, KV_HEADS, HEAD_DIM)[slot] = self.rows(1)[0]

    def rows(self, n: int) -> torch.Tensor:
        return torch.randn(n, KV_HEADS, HEAD_DIM, generator=self.gen).to(self.dtype)

    def grow(self, i: int) -> int:
        if self.lens[i] % BLOCK == 0:
            self.tables[i].append(self.free.pop())
        self.lens[i] += 1
        return self.tables[i][-1] * BLOCK + (self.lens[i] - 1) % BLOCK

    def decode_step(self, seqs: list[int]) -> AttentionMetadata:
        """Metadata of a step decoding one token of each of `seqs` (in that order)."""
        slots = [self.grow(i) for i in seqs]
        width = max((len(self.tables[i]) for i in seqs), default=1)
        tables = torch.zeros(len(seqs), width, dtype=torch.int32)
        for row, i in enumerate(seqs):
            tables[row, :len(self.tables[i])] = torch.tensor(self.tables[i])
        lens = [self.lens[i] for i in seqs]
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long), query_start_loc=torch.arange(len(seqs) + 1),
            seq_lens=torch.tensor(lens), block_tables=tables,
            query_start_loc_cpu=list(range(len(seqs) + 1)), seq_lens_cpu=lens,
            max_query_len=1, max_seq_len=max(lens, default=0), block_size=BLOCK)


def step(backends, pool: Pool, meta: AttentionMetadata):
    """Each backend's output for one decode step (k and v written by each into its own
    copy of the pool, all starting equal)."""
    k_new, v_new = pool.rows(len(meta.seq_lens_cpu)), pool.rows(len(meta.seq_lens_cpu))
    q = torch.randn(len(meta.seq_lens_cpu), HEADS, HEAD_DIM, generator=pool.gen).to(pool.dtype)
    outs = []
    for backend, (k_cache, v_cache) in backends:
        fresh = AttentionMetadata(**{**meta.__dict__, "derived": {}})
        backend.write_kv(k_new, v_new, k_cache, v_cache, fresh)
        outs.append(backend.attend(q, k_cache, v_cache, fresh, 0.125))
    return outs


def backends_and_pools(pool: Pool):
    """The held backend, one that gathers every step, the per-sequence reference: each on
    its own copy of the pool."""
    backends = (FastTorchAttentionBackend(), FastTorchAttentionBackend(), TorchAttentionBackend())
    return [(b, (pool.k.clone(), pool.v.clone())) for b in backends]


def check(runs, pool: Pool, seqs: list[int]) -> None:
    runs[1][0].held = type(runs[1][0].held)()  # forgets: every step gathers
    got, gathered, reference = step(runs, pool, pool.decode_step(seqs))
    assert torch.equal(got, gathered)
    assert not got.isnan().any()
    tol = 1e-5 if pool.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, reference, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_chain_of_decodes_gives_the_gathering_backends_bits(dtype):
    pool = Pool([60, 59, 3, 61], dtype)  # lengths cross blocks and the 64-position capacity
    runs = backends_and_pools(pool)
    for _ in range(8):
        check(runs, pool, [0, 1, 2, 3])
    held = runs[0][0].held.held[runs[0][1][0].data_ptr()]
    assert held.k.shape[1] == 128 and held.step.lens == [68, 67, 11, 69]
    check(runs, pool, [0, 1, 3])  # a sequence left: regathered
    assert held is not runs[0][0].held.held[runs[0][1][0].data_ptr()]


def test_a_float32_pool_is_not_held():
    pool = Pool([40, 39], torch.float32)
    runs = backends_and_pools(pool)
    for _ in range(3):
        check(runs, pool, [0, 1])
    assert not runs[0][0].held.held


def rewrite(runs, slot: int) -> None:
    for _, pools in runs:
        for cache in pools:
            cache.view(-1, KV_HEADS, HEAD_DIM)[slot] = 7.0


def test_a_step_between_breaks_the_chain():
    """Rows rewritten in a step between two decodes (here by hand): the held contexts are
    not used after it (they would hold the old rows)."""
    pool = Pool([30, 20])
    runs = backends_and_pools(pool)
    check(runs, pool, [0, 1])
    check(runs, pool, [0, 1])
    rewrite(runs, pool.tables[0][0] * BLOCK + 3)
    for backend, (k_cache, v_cache) in runs:  # a step of no sequences counts as a step
        empty = pool.decode_step([])
        backend.write_kv(pool.rows(0), pool.rows(0), k_cache, v_cache, empty)
    check(runs, pool, [0, 1])


def test_a_moved_block_breaks_the_chain():
    pool = Pool([30, 20])
    runs = backends_and_pools(pool)
    check(runs, pool, [0, 1])
    old, new = pool.tables[1][0], pool.free.pop()
    for _, pools in runs:
        for cache in pools:
            cache[new] = cache[old]
    pool.tables[1][0] = new
    rewrite(runs, new * BLOCK + 5)  # the moved block differs from the old one
    check(runs, pool, [0, 1])


def test_sequences_in_another_order_are_regathered():
    pool = Pool([30, 20, 25])
    runs = backends_and_pools(pool)
    check(runs, pool, [0, 1, 2])
    check(runs, pool, [1, 0, 2])


def test_past_the_byte_cap_a_layer_gathers_each_step(monkeypatch):
    """Two layers, room for one layer's contexts: the second gathers, with the same bits."""
    pool = Pool([30, 20])
    one_layer = 2 * 2 * 64 * KV_HEADS * HEAD_DIM * 2  # 2 sequences, capacity 64, k and v
    monkeypatch.setattr(torch_decode_contexts, "MAX_HELD_BYTES", one_layer)
    held = FastTorchAttentionBackend()
    layers = [(pool.k.clone(), pool.v.clone()) for _ in range(2)]
    for _ in range(3):
        meta = pool.decode_step([0, 1])
        k_new, v_new = pool.rows(2), pool.rows(2)
        q = torch.randn(2, HEADS, HEAD_DIM, generator=pool.gen).to(pool.dtype)
        for k_cache, v_cache in layers:
            fresh = AttentionMetadata(**{**meta.__dict__, "derived": {}})
            held.write_kv(k_new, v_new, k_cache, v_cache, meta)
            got = held.attend(q, k_cache, v_cache, meta, 0.125)
            gathering = FastTorchAttentionBackend()  # fresh: gathers this step
            expected = gathering.attend(q, k_cache, v_cache, fresh, 0.125)
            assert torch.equal(got, expected)
        assert list(held.held.held) == [layers[0][0].data_ptr()]
