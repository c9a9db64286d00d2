"""The norm after a mixture of experts formed in their down kernel (layers/moe_next_norm.py):
which norms get the twin, and that the next norm returns what the experts formed only for
their very output and residual (CPU, the kernel stood in by torch). The GPU engine's tokens:
tests/layers/test_norm_router.py; the kernel: tests/kernels/test_moe_small.py."""
import pytest
import torch

from parashift.context import use_state
from parashift.kernels import moe_small
from parashift.layers import moe_next_norm
from parashift.layers.layernorm import RMSNorm, add_rms_norm_torch
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.fused_moe import FusedExperts, Router
from parashift.layers.moe_next_norm import NormAfterMoe
from parashift.models.moe import MoeForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.helpers.tiny_configs import tiny_config
from tests.layers.test_norm_router import build


def test_the_norm_after_each_moe_layer_gets_the_twin():
    """Qwen3-MoE's tiny layers: MoE, dense, MoE; the final norm follows the last."""
    model = build()
    layers = model.model.layers
    assert [type(layer.input_layernorm) for layer in layers] == [RMSNorm, NormAfterMoe, RMSNorm]
    assert type(model.model.norm) is NormAfterMoe
    assert layers[0].mlp.with_next_norm == layers[1].input_layernorm.formed_with
    assert layers[2].mlp.with_next_norm == model.model.norm.formed_with
    assert not any("with_next_norm" in name for name, _ in model.named_modules())
    with use_state(ParallelState.single(), quantization=WeightQuant()):
        fp8 = MoeForCausalLM(tiny_config("qwen3-moe"), 64).model
    # the input norms' FP8 rows twins stay; the final norm feeds no FP8 layer
    assert fp8.layers[0].mlp.with_next_norm is None
    assert type(fp8.layers[1].input_layernorm) is QuantizingRMSNorm
    assert fp8.layers[2].mlp.with_next_norm == fp8.norm.formed_with


def test_the_next_norm_returns_what_the_experts_formed(monkeypatch):
    model = build()
    layer, norm_after = model.model.layers[0], model.model.layers[1].input_layernorm
    hidden = layer.mlp.gate.weight.shape[1]
    x, residual = torch.randn(1, hidden), torch.randn(1, hidden)
    monkeypatch.setenv(moe_next_norm.ENV, "1")
    monkeypatch.setattr(moe_next_norm, "use_triton", lambda t: True)
    formed = []

    def stand_in(x, weights, ids, gate_up, down, first, scales, norm):
        out = 2 * x  # no CPU GEMM (the GPU machine's CPU route gave NaNs in such a test)
        residual, weight, eps, normed, new_residual = norm
        ref_normed, ref_new_residual = add_rms_norm_torch(out, residual, weight, eps)
        normed.copy_(ref_normed), new_residual.copy_(ref_new_residual)
        formed.append(out)
        return out
    monkeypatch.setattr(moe_small, "small_experts", stand_in)
    routing = torch.tensor([[0.75, 0.25]]), torch.tensor([[3, 1]])
    monkeypatch.setattr(Router, "route", lambda self, x, k, renormalize: routing)
    monkeypatch.setattr(FusedExperts, "forward", lambda self, x, weights, ids: 3 * x)
    out, new_x = layer.post_attention_layernorm(x, residual)  # hands the residual on
    y = layer.mlp(out)
    assert formed == [y]
    normed, new_residual = norm_after(y, new_x)
    ref_normed, ref_new_residual = RMSNorm.forward(norm_after, y, new_x)
    assert torch.equal(normed, ref_normed) and torch.equal(new_residual, ref_new_residual)
    out, new_x = layer.post_attention_layernorm(x, residual)
    y = layer.mlp(out)
    with pytest.raises(RuntimeError, match="another tensor"):
        norm_after(y.clone(), new_x)
    monkeypatch.setenv(moe_next_norm.ENV, "0")  # off: the norm before hands nothing on
    out, new_x = layer.post_attention_layernorm(x, residual)
    assert torch.equal(layer.mlp(out), 3 * out) and len(formed) == 2
