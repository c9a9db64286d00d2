"""The CPU rotary path (halves swapped, [cos | cos] and [-sin | sin] rows): q and k rotated
as one where the QKV output holds them side by side, the rows kept for the step; bit for bit
the reference (apply_rotary_torch)."""
import pytest
import torch
from transformers import LlamaConfig

from parashift.layers.rotary import RotaryEmbedding, apply_rotary_torch, heads_side_by_side

HEAD_DIM, HEADS, KV_HEADS = 16, 6, 2


def qkv_views(tokens: int, dtype: torch.dtype):
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    return q.unflatten(-1, (-1, HEAD_DIM)), k.unflatten(-1, (-1, HEAD_DIM)), v


@pytest.fixture(scope="module")
def rotary():
    config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                         head_dim=HEAD_DIM, rope_theta=10000.0)
    return RotaryEmbedding(config, HEAD_DIM, 256)


@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_side_by_side_rotation_is_the_reference_bit_for_bit(rotary, tokens, dtype):
    q, k, v = qkv_views(tokens, dtype)
    assert heads_side_by_side(q, k) is not None
    positions = torch.randint(0, 256, (tokens,))
    before = v.clone()
    got_q, got_k = rotary(positions, q, k, {})
    want_q, want_k = apply_rotary_torch(positions, q, k, rotary.cos_sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(v, before)  # the joint view ends where v starts


def test_apart_q_and_k_are_rotated_each(rotary):
    q, k = torch.randn(5, HEADS, HEAD_DIM), torch.randn(5, KV_HEADS, HEAD_DIM)
    assert heads_side_by_side(q, k) is None
    q_side, k_side, _ = qkv_views(5, torch.float32)
    assert heads_side_by_side(k_side, q_side) is None  # k before q in memory
    positions = torch.arange(5)
    got, want = rotary(positions, q, k), apply_rotary_torch(positions, q, k, rotary.cos_sin)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_step_cache_keeps_cos_sin_for_the_same_positions_only(rotary):
    cache, positions = {}, torch.arange(4)
    q, k, _ = qkv_views(4, torch.float32)
    first = rotary(positions, q, k, cache)
    (held, cos, _), = cache.values()
    assert held is positions
    assert all(torch.equal(a, b) for a, b in zip(rotary(positions, q, k, cache), first))
    assert next(iter(cache.values()))[1] is cos  # reused, not gathered again
    other = torch.arange(4) + 9  # new positions object: gathered for it
    got = rotary(other, q, k, cache)
    want = apply_rotary_torch(other, q, k, rotary.cos_sin)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
