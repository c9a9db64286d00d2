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
