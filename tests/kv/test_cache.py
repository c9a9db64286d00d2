"""Sizing the KV pool from free device memory (the GPU's path, with its memory faked)."""
from types import SimpleNamespace

import pytest
import torch

from parashift.kv import cache
from parashift.kv.cache import KVCache

GIB = 2**30


def blocks_from(monkeypatch, free: float, total: float, peak: float, utilization: float = 0.9,
                profile=None, cache_class=KVCache):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(free), int(total)))
    shape = (2, 16, 2, 8)  # layers, tokens per block, KV heads, head dim
    block_bytes = 2 * 2 * 16 * 2 * 8 * 4  # K and V, float32: 4096
    config = SimpleNamespace(gpu_memory_utilization=utilization)
    profile = profile or (lambda make_scratch: int(peak))
    return cache._blocks_from_free_memory(cache_class, shape, torch.float32,
                                          torch.device("cuda"), config, block_bytes, profile)


def test_the_pool_takes_the_budget_left(monkeypatch):
    # 0.9 x 100 GiB - 60 GiB in use - 2 GiB of activations = 28 GiB
    assert blocks_from(monkeypatch, 40 * GIB, 100 * GIB, 2 * GIB) == 28 * GIB // 4096


def test_weights_that_leave_no_room_name_the_numbers_and_the_way_out(monkeypatch):
    with pytest.raises(ValueError) as error:
        blocks_from(monkeypatch, 5 * GIB, 140 * GIB, 3 * GIB)
    message = str(error.value)
    assert "no memory left for the KV cache" in message
    assert "126.0 GiB" in message and "135.0 GiB" in message and "3.00 GiB" in message
    assert "tensor or pipeline" in message and "--gpu-memory-utilization" in message


def test_the_profiles_scratch_pool_is_not_counted_as_activations(monkeypatch):
    """The profile step runs over a scratch pool of its tokens' blocks; the real pool takes
    their place, so only the peak beyond the scratch is held back from the pool."""
    made = []

    def profile(make_scratch):
        made.append(make_scratch(GIB // 4096))  # 1 GiB of scratch blocks
        return 3 * GIB  # the scratch and 2 GiB of activations

    def fake_cache(*args):
        return args

    blocks = blocks_from(monkeypatch, 40 * GIB, 100 * GIB, 0, profile=profile,
                         cache_class=fake_cache)
    assert made[0][1] == GIB // 4096  # the scratch pool was made with the blocks asked for
    assert blocks == 28 * GIB // 4096  # 0.9 x 100 - 60 - 2, as with a 2 GiB peak
