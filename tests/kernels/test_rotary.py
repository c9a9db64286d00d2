"""apply_rotary against the torch path it replaces: under the Triton
interpreter on the CPU (float32, float16; it has no bfloat16) and compiled on
CUDA (bfloat16 too)."""
from types import SimpleNamespace

import pytest
import torch

from parashift.attention.torch_ref import write_kv_slots
from parashift.kernels import rotary
from parashift.layers.rotary import RotaryEmbedding, apply_rotary_torch
from tests.kernels.common import (assert_exact, assert_graph_replays, case_tests, cuda,
                                  cuda_tests, randn)

MAX_POSITION = 4096
# strided: q and k are views split from one qkv buffer, as in LlamaAttention
CASES = [
    dict(tokens=1, q_heads=4, k_heads=2, head_dim=64),
    dict(tokens=9, q_heads=8, k_heads=2, head_dim=128, strided=True),
    dict(tokens=5, q_heads=6, k_heads=6, head_dim=96, strided=True),
    dict(tokens=64, q_heads=32, k_heads=8, head_dim=128, strided=True),
]


def make_inputs(tokens, q_heads, k_heads, head_dim, strided=False, dtype="float32", device="cpu",
                with_v=False):
    if strided:
        sizes = [q_heads * head_dim, k_heads * head_dim, k_heads * head_dim]
        q, k, v = randn((tokens, sum(sizes)), dtype, device).split(sizes, dim=-1)
        q, k, v = (t.unflatten(-1, (-1, head_dim)) for t in (q, k, v))
    else:
        q = randn((tokens, q_heads, head_dim), dtype, device)
        k = randn((tokens, k_heads, head_dim), dtype, device, seed=1)
        v = randn((tokens, k_heads, head_dim), dtype, device, seed=3)
    # unsorted, possibly repeated
    positions = torch.randint(MAX_POSITION, (tokens,), generator=torch.Generator().manual_seed(2))
    return (positions.to(device), q, k, v) if with_v else (positions.to(device), q, k)


def rotary_embedding(head_dim: int, device: str) -> RotaryEmbedding:
    return RotaryEmbedding(SimpleNamespace(rope_theta=10000.0), head_dim, MAX_POSITION).to(device)


def check(head_dim, dtype="float32", device="cpu", **shape):
    positions, q, k = make_inputs(head_dim=head_dim, dtype=dtype, device=device, **shape)
    q_in, k_in = q.clone(), k.clone()
    cos_sin = rotary_embedding(head_dim, device).cos_sin
    out = rotary.apply_rotary(positions, q, k, cos_sin)
    # fp32 products and sums rounded one by one (no FMA), as torch does, then
    # one rounding to the dtype: exact
    assert_exact(out, apply_rotary_torch(positions, q, k, cos_sin))
    assert_exact((q, k), (q_in, k_in))


test_interpreted, test_cuda = case_tests(__name__, check, CASES)

# pad: that many rows at the end have slot -1 (padding, not written)
WRITE_KV_CASES = [
    dict(tokens=1, q_heads=4, k_heads=2, head_dim=64, block_size=16),
    dict(tokens=9, q_heads=8, k_heads=2, head_dim=128, strided=True, block_size=16, pad=3),
    dict(tokens=5, q_heads=6, k_heads=6, head_dim=96, strided=True, block_size=32),
    dict(tokens=40, q_heads=32, k_heads=8, head_dim=128, strided=True, block_size=16, pad=1),
]


def check_write_kv(head_dim, block_size, pad=0, dtype="float32", device="cpu", **shape):
    """rotate_and_write_kv gives apply_rotary_torch's q and the pool write_kv_slots
    leaves with the rotated k and v; every other slot (NaN) stays untouched."""
    positions, q, k, v = make_inputs(head_dim=head_dim, dtype=dtype, device=device, with_v=True,
                                     **shape)
    tokens, k_heads = k.shape[:2]
    num_blocks = tokens // block_size + 3
    gen = torch.Generator().manual_seed(4)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[tokens - pad:] = -1
    slots = slots.to(device)
    pool = torch.full((num_blocks, block_size, k_heads, head_dim), float("nan"),
                      dtype=getattr(torch, dtype), device=device)
    cos_sin = rotary_embedding(head_dim, device).cos_sin
    q_ref, k_ref = apply_rotary_torch(positions, q, k, cos_sin)
    k_pool_ref, v_pool_ref = pool.clone(), pool.clone()
    write_kv_slots(k_ref, v, k_pool_ref, v_pool_ref, slots)
    k_pool, v_pool = pool.clone(), pool.clone()
    q_out = rotary.rotate_and_write_kv(positions, q, k, v, cos_sin, k_pool, v_pool, slots)
    assert_exact(q_out, q_ref)
    torch.testing.assert_close(k_pool, k_pool_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_pool, v_pool_ref, rtol=0, atol=0, equal_nan=True)


test_write_kv_interpreted, test_write_kv_cuda = case_tests(__name__, check_write_kv,
                                                           WRITE_KV_CASES)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_layer_runs_kernel_on_cuda_only(monkeypatch, device):
    calls = []
    monkeypatch.setattr(rotary, "apply_rotary",
                        lambda *a: calls.append(a) or apply_rotary_torch(*a))
    positions, q, k = make_inputs(3, 4, 2, 64, device=device)
    rotary_embedding(64, device)(positions, q, k)
    assert len(calls) == (device == "cuda")


@cuda
def test_cuda_graph_capture():
    positions, q, k = make_inputs(8, 32, 8, 128, strided=True, dtype="bfloat16", device="cuda")
    cos_sin = rotary_embedding(128, "cuda").cos_sin
    assert_graph_replays(lambda: rotary.apply_rotary(positions, q, k, cos_sin), [q, k])


# Qwen3's q/k norms fused before RoPE (rotate_and_write_kv's and apply_rotary's `norms`)
NORM_CASES = [dict(tokens=3, q_heads=4, k_heads=2, head_dim=64, strided=True)]
NORM_CUDA_CASES = [dict(tokens=1, q_heads=32, k_heads=4, head_dim=128, strided=True),
                   dict(tokens=17, q_heads=12, k_heads=4, head_dim=96, strided=True)]


def check_qk_norm(head_dim, dtype="float32", device="cpu", **shape):
    """The normed-then-rotated q and k against qk_norm's torch arithmetic then
    apply_rotary_torch: the same up to the last bits (the sum of squares in another order),
    through both entry points (k into the pool, or returned)."""
    from parashift.layers.layernorm import rms_norm_torch
    positions, q, k, v = make_inputs(head_dim=head_dim, dtype=dtype, device=device, with_v=True,
                                     **shape)
    gen = torch.Generator().manual_seed(5)
    q_w, k_w = (torch.rand(head_dim, generator=gen).add(0.5).to(device, q.dtype)
                for _ in range(2))
    eps = 1e-6
    cos_sin = rotary_embedding(head_dim, device).cos_sin
    q_ref, k_ref = apply_rotary_torch(positions, rms_norm_torch(q, q_w, eps),
                                      rms_norm_torch(k, k_w, eps), cos_sin)
    q_out, k_out = rotary.apply_rotary(positions, q, k, cos_sin, (q_w, k_w, eps))
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[q.dtype]
    for out, ref in ((q_out, q_ref), (k_out, k_ref)):
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        if q.dtype != torch.float32:  # most 16-bit values the same bits
            assert int((out != ref).sum()) <= 1 + out.numel() // 50
    tokens, k_heads = k.shape[:2]
    pool = torch.zeros(tokens, 1, k_heads, head_dim, dtype=q.dtype, device=device)
    v_pool = torch.zeros_like(pool)
    slots = torch.arange(tokens, device=device)
    q_pooled = rotary.rotate_and_write_kv(positions, q, k, v, cos_sin, pool, v_pool, slots,
                                          (q_w, k_w, eps))
    assert_exact(q_pooled, q_out)
    assert_exact(pool[:, 0], k_out)
    assert_exact(v_pool[:, 0], v)


test_qk_norm_interpreted, _ = case_tests(__name__, check_qk_norm, NORM_CASES)
test_qk_norm_cuda = cuda_tests(check_qk_norm, NORM_CUDA_CASES)
