"""apply_rotary against the torch path it replaces: under the Triton
interpreter on the CPU (float32, float16; it has no bfloat16) and compiled on
CUDA (bfloat16 too)."""
from types import SimpleNamespace

import pytest
import torch

from parashift.kernels import rotary
from parashift.layers.rotary import RotaryEmbedding, apply_rotary_torch
from tests.kernels.common import (assert_exact, assert_graph_replays, case_tests, cuda, randn)

MAX_POSITION = 4096
# strided: q and k are views split from one qkv buffer, as in LlamaAttention
CASES = [
    dict(tokens=1, q_heads=4, k_heads=2, head_dim=64),
    dict(tokens=9, q_heads=8, k_heads=2, head_dim=128, strided=True),
    dict(tokens=5, q_heads=6, k_heads=6, head_dim=96, strided=True),
    dict(tokens=64, q_heads=32, k_heads=8, head_dim=128, strided=True),
]


def make_inputs(tokens, q_heads, k_heads, head_dim, strided=False, dtype="float32", device="cpu"):
    if strided:
        sizes = [q_heads * head_dim, k_heads * head_dim, k_heads * head_dim]
        q, k, _ = randn((tokens, sum(sizes)), dtype, device).split(sizes, dim=-1)
        q, k = q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (k_heads, head_dim))
    else:
        q = randn((tokens, q_heads, head_dim), dtype, device)
        k = randn((tokens, k_heads, head_dim), dtype, device, seed=1)
    # unsorted, possibly repeated
    positions = torch.randint(MAX_POSITION, (tokens,), generator=torch.Generator().manual_seed(2))
    return positions.to(device), q, k


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
