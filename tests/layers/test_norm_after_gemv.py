"""The residual add and RMSNorm after o_proj and down_proj done in their GEMVs' last program
(layers/norm_after_gemv.py): which layers fold, that the norm after returns the tail's
outputs only for the very output and residual and is the plain norm otherwise (CPU, the GPU's
kernel stood in by torch), and on the GPU (PARASHIFT_TEST_DEVICE=cuda) the real kernel through
the twins and an engine's greedy FP8 tokens with the folds equal to those without."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import fp8_gemm, fp8_gemv
from parashift.layers import norm_after_gemv
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.layernorm import add_rms_norm_torch
from parashift.layers.norm_after_gemv import FoldedNorm, TailHook
from parashift.quantization.fp8 import dequantize, quantize_rows
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY
from tests.layers.test_norm_gemv import build as build_llama

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")
LAYERS = range(TINY["num_hidden_layers"])


def build(quantization=WeightQuant(), **context):
    return build_llama(quantization, **context)


def folded(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, FoldedNorm)]


def test_off_by_default_and_a_bad_switch_is_an_error(monkeypatch):
    monkeypatch.delenv(norm_after_gemv.ENV, raising=False)
    assert not folded(build())
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    model = build()
    assert folded(model) == [f"model.layers.{i}.{name}" for i in LAYERS for name in (
        "input_layernorm", "post_attention_layernorm")] + ["model.norm"]
    layers = model.model.layers
    for i, layer in enumerate(layers):
        o_hook, down_hook = layer.self_attn.o_proj.gemm_hook, layer.mlp.down_proj.gemm_hook
        assert isinstance(o_hook, TailHook) and o_hook.inner is None
        assert isinstance(down_hook, TailHook) and down_hook.inner is None
        assert layer.input_layernorm.tap is o_hook
        assert layer.post_attention_layernorm.tap is down_hook
        assert o_hook._norm is layer.post_attention_layernorm
        after_down = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        assert down_hook._norm is after_down and after_down.takes_tails
        # fp8_input.py's quantizing norm is what the twin falls back on and hands rows for
        assert isinstance(layer.post_attention_layernorm._plain.__self__, QuantizingRMSNorm)
    assert model.model.norm.tap is None
    assert set(model.state_dict()) == set(build().state_dict())
    assert not folded(build(None))  # bf16: no FP8 GEMV
    assert not folded(build(reduction_chunks=4))  # deterministic mode: its own GEMMs
    assert not folded(build(WeightQuant(serialized=True, static_activations=True)))
    monkeypatch.setenv(norm_after_gemv.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_NORM_AFTER_GEMV='yes'"):
        build()


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: a measured one-part GEMV config for up to 4 rows and the
    GEMV with its norm tail by torch, recording the rows of each call."""
    calls = []

    def gemv(x, weight, scale, bias, *config, ahead=False, tail=None):
        calls.append(x.shape[0])
        y = F.linear(x, dequantize(weight, scale, x.dtype), bias)
        out, added = add_rms_norm_torch(y, tail.residual, tail.weight, tail.eps)
        tail.out.copy_(out)
        tail.new_residual.copy_(added)
        if tail.rows_fp8 is not None:
            rows, scales = quantize_rows(out)
            tail.rows_fp8.copy_(rows)
            tail.scales.copy_(scales)
        return y
    config = fp8_gemm.Config("gemv", 4, 64, 4, 1, ahead=True)
    monkeypatch.setattr(norm_after_gemv, "use_triton", lambda x: True)
    monkeypatch.setattr(fp8_gemm, "measured_choice",
                        lambda rows, *args: config if rows <= 4 else None)
    monkeypatch.setattr(fp8_gemv, "fp8_gemv", gemv)
    return calls


def seeded(model):
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data.copy_((torch.randn(p.shape, generator=gen) * 0.2
                      + (1 if p.dim() == 1 or p.dtype == torch.float32 else 0)).to(p.dtype))
    return model


def plain_outputs(layer, x, r, attn):
    """What the unfolded layer gives: input norm, o_proj, post-attention norm."""
    h, residual = add_rms_norm_torch(x, r, layer.input_layernorm.weight, 1e-5)
    o_proj = layer.self_attn.o_proj
    o = F.linear(attn, dequantize(o_proj.weight, o_proj.weight_scale, attn.dtype))
    return (h, residual, o) + add_rms_norm_torch(o, residual,
                                                 layer.post_attention_layernorm.weight, 1e-5)


def test_the_layer_gives_the_plain_outputs_folded(monkeypatch, gpu_stand_ins):
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    layer = seeded(build()).model.layers[1]
    gen = torch.Generator().manual_seed(1)
    x, r, attn = (torch.randn(3, 64, generator=gen) for _ in range(3))
    h, residual, o, normed, added = plain_outputs(layer, x, r, attn)
    got_h, got_residual = layer.input_layernorm(x, r)
    torch.testing.assert_close((got_h, got_residual), (h, residual))
    got_o = layer.self_attn.o_proj(attn)
    torch.testing.assert_close(got_o, o)
    held = layer.post_attention_layernorm._held
    out = layer.post_attention_layernorm(got_o, got_residual)
    assert out[0] is held[1].out and out[1] is held[1].new_residual  # the tail's, as made
    torch.testing.assert_close(out, (normed, added))
    assert gpu_stand_ins == [3]
    # another residual than the one expected: the plain norm of the computed output
    layer.input_layernorm(x, r)
    got_o = layer.self_attn.o_proj(attn)
    other = r.clone()
    torch.testing.assert_close(layer.post_attention_layernorm(got_o, other),
                               add_rms_norm_torch(o, other, layer.post_attention_layernorm.weight,
                                                  1e-5))
    # 6 rows: no GEMV of the GEMV's rows, the plain path (and nothing held)
    six = [t.repeat(2, 1) for t in (x, r, attn)]
    layer.input_layernorm(*six[:2])
    layer.self_attn.o_proj(six[2])
    assert gpu_stand_ins == [3, 3] and layer.post_attention_layernorm._held is None
    # switched off after the build (a graph variant's capture): the plain path
    monkeypatch.setenv(norm_after_gemv.ENV, "0")
    layer.input_layernorm(x, r)
    torch.testing.assert_close(layer.self_attn.o_proj(attn), o)
    assert gpu_stand_ins == [3, 3] and layer.post_attention_layernorm._held is None


def test_down_folds_the_next_layers_norm_and_the_last_the_final_norm(monkeypatch,
                                                                     gpu_stand_ins):
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    model = seeded(build()).model
    gen = torch.Generator().manual_seed(3)
    o, r = torch.randn(2, 64, generator=gen), torch.randn(2, 64, generator=gen)
    for i, layer in enumerate(model.layers):
        h, residual = layer.post_attention_layernorm(o, r)
        down = layer.mlp(h)
        after = model.layers[i + 1].input_layernorm if i + 1 in LAYERS else model.norm
        held = after._held
        normed, added = after(down, residual)
        assert normed is held[1].out and added is held[1].new_residual
        torch.testing.assert_close((normed, added),
                                   add_rms_norm_torch(down, residual, after.weight, 1e-5))
    assert gpu_stand_ins == [2, 2]


def test_the_first_layer_folds_with_x_as_its_residual(monkeypatch, gpu_stand_ins):
    """Without a residual the decoder layer keeps the norm's input as the residual."""
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    layer = seeded(build()).model.layers[0]
    x, attn = torch.randn(1, 64), torch.randn(1, 64)
    layer.input_layernorm(x)
    o = layer.self_attn.o_proj(attn)
    normed, added = layer.post_attention_layernorm(o, x)
    torch.testing.assert_close(added, o + x)
    torch.testing.assert_close(normed, add_rms_norm_torch(o, x, layer.post_attention_layernorm
                                                          .weight, 1e-5)[0])
    assert gpu_stand_ins == [1]


def test_rows_in_e4m3_are_handed_on_where_the_norm_would_quantize(monkeypatch, gpu_stand_ins):
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    layer = seeded(build()).model.layers[1]
    norm = layer.post_attention_layernorm
    monkeypatch.setattr(norm, "_quantizes", lambda x, residual: True)
    x, r, attn = torch.randn(2, 64), torch.randn(2, 64), torch.randn(2, 64)
    _, residual = layer.input_layernorm(x, r)
    normed, _ = norm(layer.self_attn.o_proj(attn), residual)
    rows, scales = layer.mlp.gate_up_proj.fp8_input.take(normed)
    expected = quantize_rows(normed)
    assert torch.equal(rows.view(torch.uint8), expected[0].view(torch.uint8))
    torch.testing.assert_close(scales, expected[1])


def test_the_twins_are_the_plain_norms_on_the_cpu(monkeypatch):
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    layer = seeded(build()).model.layers[1]
    monkeypatch.setattr(fp8_gemm, "measured_choice", lambda *a: pytest.fail("asked on the CPU"))
    x, r, attn = torch.randn(1, 64), torch.randn(1, 64), torch.randn(1, 64)
    h, residual, o, normed, added = plain_outputs(layer, x, r, attn)
    got = layer.input_layernorm(x, r)
    got_o = layer.self_attn.o_proj(attn)
    torch.testing.assert_close(layer.post_attention_layernorm(got_o, got[1]), (normed, added))


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("rows", [1, 2])
def test_the_layer_folds_with_the_kernel_on_the_gpu(monkeypatch, rows):
    """The real kernel through the twins (its config forced: the tiny o_proj's measured
    choice need not be a GEMV)."""
    monkeypatch.setenv(norm_after_gemv.ENV, "1")
    layer = seeded(build()).model.layers[1].to("cuda")
    config = fp8_gemm.Config("gemv", 4, 64, 2, 1, ahead=True)
    monkeypatch.setattr(fp8_gemm, "measured_choice", lambda *args: config)
    gen = torch.Generator().manual_seed(2)
    x, r, attn = (torch.randn(rows, 64, generator=gen).cuda() for _ in range(3))
    _, residual = layer.input_layernorm(x, r)
    o = layer.self_attn.o_proj(attn)
    held = layer.post_attention_layernorm._held
    normed, added = layer.post_attention_layernorm(o, residual)
    assert held is not None and normed is held[1].out and added is held[1].new_residual
    o_proj = layer.self_attn.o_proj
    plain = fp8_gemv.fp8_gemv(attn, o_proj.weight, o_proj.weight_scale, None, 4, 64, 2, 1,
                              ahead=True)
    assert torch.equal(o, plain)
    expected = add_rms_norm_torch(plain, residual, layer.post_attention_layernorm.weight, 1e-5)
    assert torch.equal(added, expected[1])
    torch.testing.assert_close(normed, expected[0], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """tokens(quantization, mode): greedy tokens with PARASHIFT_NORM_AFTER_GEMV=mode."""
    return switch_tokens(tiny_llama_dir, DEVICE, norm_after_gemv.ENV)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_folded_engine_gives_the_unfolded_tokens(engine_tokens):
    """(Folds only where the tiny o_proj's one-row choice is a GEMV of one part of K.)"""
    assert engine_tokens("fp8", "1") == engine_tokens("fp8", "0")
