"""The CPU KV tier: slot accounting, sizing, the host-memory refusal, and the KV of one
plan's ranks gathered into the tier and scattered into another plan's pools bit for bit."""
import os
import random

import pytest
import torch

from parashift import host_memory
from parashift.kv.cpu_tier import CpuKVTier, TierShape
from parashift.kv.tier_allocator import TierAllocator
from parashift.kv.tier_copy import gather, rank_kv_slice, scatter, token_slots
from parashift.parallel.plan import Plan


def test_slots_are_first_fit_and_freed_ranges_merge():
    tier = TierAllocator(100)
    a, b, c = tier.allocate("a", 30), tier.allocate("b", 30), tier.allocate("c", 30)
    assert (a.start, b.start, c.start) == (0, 30, 60) and tier.used_tokens == 90
    tier.free("b")
    assert tier.allocate("big", 40) is None  # 40 free tokens, but no range of 40
    assert tier.allocate("d", 20).start == 30  # first fit: the hole b left
    tier.free("a")
    tier.free("d")  # merges with a's range on its left and the 10 tokens on its right
    assert tier.largest_free() == 60 and tier.allocate("e", 60).start == 0
    for request in ("c", "e"):
        tier.free(request)
    assert tier.used_tokens == 0 and tier.largest_free() == 100 and tier.fill == 0.0


def test_free_in_every_state_returns_the_slot_and_is_idempotent():
    tier = TierAllocator(64)
    for state in ("writing", "stashed", "loading"):
        tier.allocate(state, 20)
        if state != "writing":
            tier.mark(state, state)
    assert tier.requests_in("stashed") == ["stashed"] and tier.fill == 60 / 64
    for state in ("writing", "stashed", "loading"):
        assert tier.free(state) == 20
        assert tier.free(state) == 0  # an abort after the finish frees nothing twice
    assert tier.used_tokens == 0 and tier.largest_free() == 64


def test_bad_slot_requests_are_refused():
    tier = TierAllocator(8)
    tier.allocate("a", 4)
    with pytest.raises(ValueError, match="already holds"):
        tier.allocate("a", 2)
    with pytest.raises(ValueError, match="at least one token"):
        tier.allocate("b", 0)
    with pytest.raises(ValueError, match="unknown CPU KV slot state"):
        tier.mark("a", "parked")
    with pytest.raises(ValueError, match="at least one token"):
        TierAllocator(0)


def test_the_tier_is_sized_by_tokens_or_gib():
    shape = TierShape(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)
    assert shape.token_bytes == 2 * 30 * 3 * 64 * 2
    assert shape.tokens_for(1000, None) == 1000
    assert shape.tokens_for(None, 1.0) == 2**30 // shape.token_bytes
    with pytest.raises(ValueError, match="one of cpu_kv_tokens or cpu_kv_gib"):
        shape.tokens_for(1000, 1.0)
    with pytest.raises(ValueError, match="holds no token"):
        shape.tokens_for(None, 1e-9)


def test_the_tier_is_shared_between_mappings_and_removed_by_its_creator():
    shape = TierShape(2, 2, 4, torch.float16)
    tier = CpuKVTier.create(shape, 8)
    assert tier.path.startswith("/dev/shm/") and tier.nbytes == 8 * shape.token_bytes
    other = CpuKVTier.open(tier.path, shape, 8)
    tier.buffer[1, 0, 1, 5].fill_(7.0)
    assert (other.buffer[1, 0, 1, 5] == 7.0).all()  # one buffer, two mappings
    other.close()
    assert os.path.exists(tier.path)
    tier.close()
    assert not os.path.exists(tier.path)


def test_start_up_refuses_a_tier_the_host_cannot_hold(monkeypatch, tmp_path):
    shape = TierShape(2, 2, 4, torch.float16)
    monkeypatch.setattr(host_memory, "mem_available_bytes", lambda: 10 * shape.token_bytes)
    with pytest.raises(ValueError, match="host memory cannot hold CPU KV tier"):
        CpuKVTier.create(shape, 11, directory=str(tmp_path))
    monkeypatch.setattr(host_memory, "mem_available_bytes", lambda: None)
    monkeypatch.setattr(host_memory, "shm_free_bytes", lambda: shape.token_bytes)
    with pytest.raises(ValueError, match="/dev/shm cannot hold"):
        CpuKVTier.create(shape, 2)


# ---- moving KV between plans ----------------------------------------------------------
BLOCK, HEAD_DIM = 4, 8
LENGTHS = [1, 3, 4, 5, 9, 13, 16]  # ragged, below, on and across page boundaries


def _rank_pools(plan, num_layers, num_kv_heads, num_blocks, gen):
    """Per rank: its slice and a pool of that slice filled with noise."""
    pools = {}
    for rank in plan.ranks:
        s = rank_kv_slice(plan, rank, num_layers, num_kv_heads)
        shape = (len(s.layers), num_blocks, BLOCK, len(s.heads), HEAD_DIM)
        pools[rank] = (s, torch.randn(shape, generator=gen).bfloat16(),
                       torch.randn(shape, generator=gen).bfloat16())
    return pools


def _tables(num_blocks, rng):
    """A block table per request over shuffled block ids (the plan's block manager)."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    return [[free.pop() for _ in range(-(-n // BLOCK))] for n in LENGTHS]


def _read(pool, table, n):
    return pool.flatten(1, 2)[:, token_slots(table, n, BLOCK, pool.device)]


@pytest.mark.parametrize("prefill,decode,num_layers,num_kv_heads", [
    ("pp2", "tp2", 5, 4), ("pp3", "tp3", 7, 3), ("pp2xtp2", "tp4", 6, 4),
    ("pp4", "pp2xtp2", 9, 2), ("pp2", "tp4", 4, 2),  # 2 KV heads over 4 ranks: replicated
])
def test_kv_moves_between_plans_bit_for_bit(prefill, decode, num_layers, num_kv_heads, tmp_path):
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    num_blocks = 2 * sum(-(-n // BLOCK) for n in LENGTHS)
    full = [(torch.randn(num_layers, n, num_kv_heads, HEAD_DIM, generator=gen).bfloat16(),
             torch.randn(num_layers, n, num_kv_heads, HEAD_DIM, generator=gen).bfloat16())
            for n in LENGTHS]
    shape = TierShape(num_layers, num_kv_heads, HEAD_DIM, torch.bfloat16)
    tier = CpuKVTier.create(shape, sum(LENGTHS) + 40, directory=str(tmp_path))
    slots = TierAllocator(tier.tokens)
    for i in range(8):  # fragment the tier: requests land in the holes of freed ones
        slots.allocate(f"pad{i}", 5)
    for i in range(0, 8, 2):
        slots.free(f"pad{i}")

    p_plan, p_pools = Plan.parse(prefill), None
    p_pools = _rank_pools(p_plan, num_layers, num_kv_heads, num_blocks, gen)
    p_tables = _tables(num_blocks, rng)
    for r, (n, (k, v)) in enumerate(zip(LENGTHS, full)):  # the prefill plan's ranks write KV
        for s, pool_k, pool_v in p_pools.values():
            index = token_slots(p_tables[r], n, BLOCK, pool_k.device)
            for pool, src in ((pool_k, k), (pool_v, v)):
                pool.flatten(1, 2)[:, index] = src[s.layers.start:s.layers.stop, :,
                                                   s.heads.start:s.heads.stop]
    moved = 0
    for r, n in enumerate(LENGTHS):
        slot = slots.allocate(f"req{r}", n)
        for s, pool_k, pool_v in p_pools.values():
            moved += gather(pool_k, pool_v, p_tables[r], n, s, tier, slot)
        slots.mark(f"req{r}", "stashed")

    d_plan = Plan.parse(decode)
    d_pools = _rank_pools(d_plan, num_layers, num_kv_heads, num_blocks, gen)
    d_tables = _tables(num_blocks, rng)
    for r, (n, (k, v)) in enumerate(zip(LENGTHS, full)):
        slots.mark(f"req{r}", "loading")
        for s, pool_k, pool_v in d_pools.values():
            scatter(tier, slots.slots[f"req{r}"], n, s, pool_k, pool_v, d_tables[r])
            want = (t[s.layers.start:s.layers.stop, :, s.heads.start:s.heads.stop] for t in (k, v))
            for pool, expected in zip((pool_k, pool_v), want):
                assert torch.equal(_read(pool, d_tables[r], n), expected)
        slots.free(f"req{r}")
    replication = max(1, p_plan.attn_degree // num_kv_heads)
    assert moved == replication * sum(LENGTHS) * shape.token_bytes
    for i in range(1, 8, 2):
        slots.free(f"pad{i}")
    assert slots.used_tokens == 0 and slots.largest_free() == tier.tokens
    tier.close()


def test_a_pool_that_does_not_hold_the_slice_is_refused(tmp_path):
    tier = CpuKVTier.create(TierShape(4, 2, HEAD_DIM, torch.bfloat16), 8, directory=str(tmp_path))
    slot = TierAllocator(8).allocate("a", 8)
    wrong = rank_kv_slice(Plan(tp=2), 0, 4, 2)  # 4 layers x 1 head; the pool has 2 heads
    pool = torch.zeros(4, 2, BLOCK, 2, HEAD_DIM, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="does not hold the slice"):
        gather(pool, pool, [0, 1], 8, wrong, tier, slot)
    with pytest.raises(ValueError, match="do not fit a CPU KV slot"):
        scatter(tier, slot, 9, rank_kv_slice(Plan(), 0, 4, 2), pool, pool, [0, 1, 0])
    tier.close()


class _FakeCudart:
    """cudaHostRegister / cudaHostUnregister as recorded calls (CI has no GPU)."""

    def __init__(self, register_error: int):
        self.register_error, self.registered, self.unregistered = register_error, [], []

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes, flags))
        return self.register_error

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


def test_page_locking_registers_the_mapping_once_and_close_unregisters_it(monkeypatch, tmp_path):
    cudart = _FakeCudart(register_error=0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    tier = CpuKVTier.create(TierShape(2, 2, 4, torch.float16), 8, directory=str(tmp_path))
    tier.page_lock()
    tier.page_lock()
    assert cudart.registered == [(tier.buffer.data_ptr(), tier.nbytes, 0)] and tier.pinned
    ptr = tier.buffer.data_ptr()
    tier.close()
    assert cudart.unregistered == [ptr] and not tier.pinned


def test_a_failed_page_lock_names_the_size_and_the_remedy(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(register_error=2))
    tier = CpuKVTier.create(TierShape(2, 2, 4, torch.float16), 8, directory=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"GiB .* CUDA error 2.*lower --cpu-kv-tokens"):
        tier.page_lock()
    assert not tier.pinned
    tier.close()


def test_a_tier_opened_for_a_cpu_device_is_not_page_locked(tmp_path):
    tier = CpuKVTier.create(TierShape(2, 2, 4, torch.float16), 8, directory=str(tmp_path))
    other = CpuKVTier.open(tier.path, tier.shape, 8, torch.device("cpu"))
    assert not other.pinned
    other.close()
    tier.close()
