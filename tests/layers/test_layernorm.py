"""The CPU RMSNorm rounds as transformers' LlamaRMSNorm: bit for bit in fp32 (the fused
`F.rms_norm`) and in bf16 (the normalized rows rounded before the weight's product)."""
import pytest
import torch

from parashift.layers.layernorm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 576), (37, 576), (5, 9, 64)])
def test_rms_norm_equals_transformers(dtype, shape):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    gen = torch.Generator().manual_seed(shape[0])
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype)
    ours, theirs = RMSNorm(shape[-1], 1e-5), LlamaRMSNorm(shape[-1], 1e-5)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    ours.weight.data, theirs.weight.data = weight.clone(), weight.clone()
    theirs = theirs.to(dtype)
    assert torch.equal(ours(x), theirs(x))
    normed, added = ours(x, residual)
    assert torch.equal(added, x + residual) and torch.equal(normed, theirs(x + residual))


@pytest.mark.parametrize("device", ["cpu", pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("tokens", [3, 300])  # on CUDA: one row a program, then 16
def test_qk_norm_is_the_two_norms(monkeypatch, device, tokens):
    """Qwen3's q and k norms over the QKV projection's split output: one launch on CUDA,
    the bits of the two norms; the CPU (and q, k apart in memory) runs the two."""
    from parashift.kernels import rmsnorm
    from parashift.layers.layernorm import qk_norm
    gen = torch.Generator().manual_seed(tokens)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    qkv = torch.randn(tokens, (32 + 4 + 4) * 64, generator=gen).to(device, dtype)
    q, k, _ = (t.unflatten(-1, (-1, 64)) for t in qkv.split([32 * 64, 4 * 64, 4 * 64], -1))
    q_norm, k_norm = RMSNorm(64).to(device), RMSNorm(64).to(device)
    q_norm.weight.data = torch.randn(64, generator=gen).to(device)
    k_norm.weight.data = torch.randn(64, generator=gen).to(device)
    launches = []
    real = rmsnorm.rms_norm_heads
    monkeypatch.setattr(rmsnorm, "rms_norm_heads", lambda *a: launches.append(1) or real(*a))
    out_q, out_k = qk_norm(q_norm, k_norm, q, k)
    assert len(launches) == (device == "cuda")  # (q's own norm at 300 tokens launches it too)
    assert torch.equal(out_q, q_norm(q)) and torch.equal(out_k, k_norm(k))
    launches.clear()
    apart = qk_norm(q_norm, k_norm, q, k.clone())  # not side by side: the two norms
    assert len(launches) == (device == "cuda" and q.shape[0] * q.shape[1] >= rmsnorm.MANY_HEAD_ROWS)
    assert torch.equal(apart[0], out_q) and torch.equal(apart[1], out_k)
