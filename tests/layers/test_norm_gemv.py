"""The RMSNorm inside the next layer's GEMV (layers/norm_gemv.py): which norms fuse, that the
layer computes from what was handed over only for the very tensor (CPU, the GPU's kernels
stood in by torch), and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens
with the fusion equal to those without, bf16 and FP8."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.context import use_state
from parashift.kernels import gated_gemv, norm_gemv as norm_kernels
from parashift.layers import norm_gemv, silu_gemv
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.layernorm import add_rms_norm_torch, rms_norm_torch
from parashift.layers.linear import WeightPart
from parashift.layers.norm_gemv import HeldNorm, NormHook, NormIntoGemv, fuse_norm_into_gemv
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")
NORMS = ("input_layernorm", "post_attention_layernorm")


def build(quantization=None, **context):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**TINY, tie_word_embeddings=False)
    with use_state(ParallelState.single(), quantization=quantization, **context):
        return LlamaForCausalLM(cfg, 64)


def twins(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, NormIntoGemv)]


def test_off_by_default_and_a_bad_switch_is_an_error(monkeypatch):
    monkeypatch.delenv(norm_gemv.ENV, raising=False)
    assert not twins(build())
    monkeypatch.setenv(norm_gemv.ENV, "1")
    assert twins(build()) == [f"model.layers.{i}.{name}" for i in range(TINY["num_hidden_layers"])
                              for name in NORMS]
    monkeypatch.setenv(norm_gemv.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_NORM_IN_GEMV='yes'"):
        build()


@pytest.mark.parametrize("quantization", [None, WeightQuant()], ids=["bf16", "fp8"])
def test_each_norm_hooks_the_layer_it_feeds(monkeypatch, quantization):
    monkeypatch.setenv(norm_gemv.ENV, "1")
    monkeypatch.setenv(silu_gemv.ENV, "gate_up")
    model = build(quantization)
    for layer in model.model.layers:
        qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
        assert isinstance(qkv.gemm_hook, NormHook) and qkv.gemm_hook.inner is None
        assert layer.input_layernorm.hook is qkv.gemm_hook
        assert layer.post_attention_layernorm.hook is gate_up.gemm_hook
        assert layer.input_layernorm.weight is layer.input_layernorm._plain.__self__.weight
        if quantization is None:  # the SiLU hook stays, wrapped
            assert isinstance(gate_up.gemm_hook.inner, silu_gemv.GateUpHook)
        else:  # fp8_input.py's quantizing norm is what the twin falls back on
            assert isinstance(layer.input_layernorm._plain.__self__, QuantizingRMSNorm)
    assert set(model.state_dict()) == set(build(quantization).state_dict())
    assert not twins(build(reduction_chunks=4))  # deterministic mode: its own GEMMs
    assert not twins(build(WeightQuant(serialized=True, static_activations=True)))
    assert fuse_norm_into_gemv(model) == 0  # twins are not replaced again


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: both fusions chosen for up to 4 rows, the fused GEMVs by
    torch, recording their calls."""
    calls = []

    def norm_linear(x, residual, norm_weight, eps, weight, scale, bias, config, silu,
                    new_residual):
        calls.append(("norm", silu))
        normed, added = ((rms_norm_torch(x, norm_weight, eps), x) if residual is None else
                         add_rms_norm_torch(x, residual, norm_weight, eps))
        new_residual.copy_(added)
        y = F.linear(normed, weight, bias)
        return (silu_and_mul_torch(y) if silu else y), new_residual

    def silu_linear(kind, x, weight, scale, bias, config):
        calls.append(("silu", kind))
        return silu_and_mul_torch(F.linear(x, weight, bias))
    for module in (norm_gemv, silu_gemv):
        monkeypatch.setattr(module, "use_triton", lambda x: True)
    monkeypatch.setattr(norm_kernels, "choice",
                        lambda x, *args: "cfg" if x.shape[0] <= 4 else None)
    monkeypatch.setattr(norm_kernels, "fused_linear", norm_linear)
    monkeypatch.setattr(gated_gemv, "choice",
                        lambda kind, x, *args: "cfg" if x.shape[0] <= 4 else None)
    monkeypatch.setattr(gated_gemv, "fused_linear", silu_linear)
    return calls


def seeded(model):
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1 if p.dim() == 1 else 0))
    return model


@pytest.mark.parametrize("residual", [True, False])
def test_the_layers_give_the_plain_outputs_fused(monkeypatch, gpu_stand_ins, residual):
    monkeypatch.setenv(silu_gemv.ENV, "gate_up")
    monkeypatch.setenv(norm_gemv.ENV, "1")
    layer = seeded(build()).model.layers[0]
    gen = torch.Generator().manual_seed(1)
    x, r = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    args = (x, r) if residual else (x,)
    normed, added = add_rms_norm_torch(x, r, layer.input_layernorm.weight, 1e-5) \
        if residual else (rms_norm_torch(x, layer.input_layernorm.weight, 1e-5), x)
    out = layer.input_layernorm(*args)
    h, new_residual = out if residual else (out, x)
    torch.testing.assert_close(layer.self_attn.qkv_proj(h),
                               F.linear(normed, layer.self_attn.qkv_proj.weight))
    torch.testing.assert_close(new_residual, added)
    h, _ = layer.post_attention_layernorm(x, r)
    normed, _ = add_rms_norm_torch(x, r, layer.post_attention_layernorm.weight, 1e-5)
    expected = F.linear(silu_and_mul_torch(F.linear(normed, layer.mlp.gate_up_proj.weight)),
                        layer.mlp.down_proj.weight)
    torch.testing.assert_close(layer.mlp(h), expected)
    # the first layer's norm (no residual) is the plain one
    assert gpu_stand_ins == [("norm", False)] * residual + [("norm", True)]
    assert layer.mlp.act.activated is None
    six = (x.repeat(2, 1), r.repeat(2, 1))  # 6 rows: the plain ops, no GEMV
    h, _ = layer.post_attention_layernorm(*six)
    torch.testing.assert_close(layer.mlp(h), expected.repeat(2, 1), rtol=1e-4, atol=1e-5)
    assert len(gpu_stand_ins) == 1 + residual


def test_the_hook_computes_only_for_its_tensor_and_weight_once():
    hook, weight = NormHook(None), torch.randn(8, 4)
    x, placeholder = torch.randn(2, 4), torch.empty(2, 4)
    held = HeldNorm(placeholder, x, None, x, None, weight, "cfg", None)
    assert hook.take(x, WeightPart(weight, None)) is None  # nothing held: the plain GEMM
    hook.put(held)
    with pytest.raises(RuntimeError, match="another tensor"):
        hook.take(placeholder.clone(), WeightPart(weight, None))
    assert hook.take(placeholder, WeightPart(weight, None)) is None  # the miss dropped it
    hook.put(held)
    with pytest.raises(RuntimeError, match="another tensor"):
        hook.take(placeholder, WeightPart(weight.clone(), None))


def test_the_twin_is_the_plain_norm_on_the_cpu(monkeypatch):
    monkeypatch.setenv(norm_gemv.ENV, "1")
    layer = seeded(build()).model.layers[0]
    monkeypatch.setattr(norm_kernels, "choice", lambda *args: pytest.fail("asked on the CPU"))
    x, r = torch.randn(2, 64), torch.randn(2, 64)
    normed, added = layer.input_layernorm(x, r)
    expected = add_rms_norm_torch(x, r, layer.input_layernorm.weight, 1e-5)
    torch.testing.assert_close(normed, expected[0])
    torch.testing.assert_close(added, expected[1])


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """tokens(quantization, mode): greedy tokens with PARASHIFT_NORM_IN_GEMV=mode."""
    return switch_tokens(tiny_llama_dir, DEVICE, norm_gemv.ENV)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_fused_engine_gives_the_unfused_tokens(engine_tokens, quantization):
    assert engine_tokens(quantization, "1") == engine_tokens(quantization, "0")
