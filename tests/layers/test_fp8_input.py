"""FP8 activations made by the op before an FP8 linear layer: which ops of a model hand them
over, that the layer takes them only with the tensor they were made of (CPU, the GPU's
kernels and GEMM stood in by torch), and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an FP8
engine's greedy tokens and logprobs with the fused kernels equal to those without."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.context import use_state
from parashift.kernels import fp8_gemm, rmsnorm, silu_mul
from parashift.layers import fp8_input
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.fp8_input import (FP8Handoff, QuantizingRMSNorm, QuantizingSiluAndMul,
                                        hand_over_fp8_inputs)
from parashift.layers.layernorm import RMSNorm, add_rms_norm_torch
from parashift.layers.linear import LinearBase
from parashift.models.llama import LlamaForCausalLM
from parashift.models.moe import MoeForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization import fp8
from parashift.quantization.scheme import WeightQuant
from tests.deterministic.test_batch_invariance import GREEDY, assert_identical, requests
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)
from tests.helpers.tiny_configs import TINY, tiny_config

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")  # "cuda": the GPU kernels, graphs


def build(quantization=WeightQuant(), **context):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**TINY, tie_word_embeddings=False)
    with use_state(ParallelState.single(), quantization=quantization, **context):
        return LlamaForCausalLM(cfg, 64)


def producers(model) -> dict[str, type]:
    """The quantizing twins by name, as their kind (layers/fp8_gated_silu.py's twin is a
    QuantizingSiluAndMul)."""
    kinds = (QuantizingRMSNorm, QuantizingSiluAndMul)
    return {name: next(kind for kind in kinds if isinstance(m, kind))
            for name, m in model.named_modules() if isinstance(m, kinds)}


@pytest.fixture(autouse=True)
def fused(monkeypatch):
    """The fusion on, whatever the environment says."""
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")


def test_the_fusion_is_on_by_default(monkeypatch):
    monkeypatch.delenv("PARASHIFT_FP8_FUSED_INPUT")
    default = producers(build())
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")
    assert default and default == producers(build())


def test_fp8_llama_hands_its_norms_and_activations_outputs_to_the_layers_after(monkeypatch):
    model = build()
    for layer in model.model.layers:
        pairs = [(layer.input_layernorm, layer.self_attn.qkv_proj),
                 (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
                 (layer.mlp.act, layer.mlp.down_proj)]
        for producer, consumer in pairs:
            assert isinstance(producer, (QuantizingRMSNorm, QuantizingSiluAndMul))
            assert producer.handoff is consumer.fp8_input
        assert layer.self_attn.o_proj.fp8_input is None  # attention's output: not an op here
    assert not isinstance(model.model.norm, QuantizingRMSNorm)  # the LM head is bf16
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "0")
    plain = build()
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert len(list(model.modules())) == len(list(plain.modules()))  # no consumer as a child


def test_a_mixture_of_experts_fuses_its_attention_input_and_its_dense_layer():
    """The experts' input stays bf16 (the router reads it; the grouped GEMM widens FP8)."""
    cfg = tiny_config("qwen3-moe")  # layer 1 dense, the others experts
    with use_state(ParallelState.single(), quantization=WeightQuant()):
        model = MoeForCausalLM(cfg, 64)
    expected = {f"model.layers.{i}.input_layernorm" for i in range(cfg.num_hidden_layers)}
    expected |= {"model.layers.1.mlp.act", "model.layers.1.post_attention_layernorm"}
    assert cfg.num_hidden_layers > 2 and set(producers(model)) == expected


def test_only_dynamic_fp8_in_the_default_mode_is_fused(monkeypatch):
    assert not producers(build(quantization=None))
    assert not producers(build(reduction_chunks=4))  # deterministic mode dequantizes
    assert not producers(build(quantization=WeightQuant(serialized=True,
                                                        static_activations=True)))
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "0")
    assert not producers(build())
    for mode, twins in [("norm", {QuantizingRMSNorm}), ("silu", {QuantizingSiluAndMul}),
                        ("norm,silu", {QuantizingRMSNorm, QuantizingSiluAndMul})]:
        monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", mode)
        assert set(producers(build()).values()) == twins
    for mode in ("yes", "norm,gelu", ""):
        monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", mode)
        with pytest.raises(ValueError, match=f"PARASHIFT_FP8_FUSED_INPUT='{mode}'"):
            build()


def test_a_handoff_gives_its_rows_once_and_only_for_their_tensor():
    handoff, x, rows, scales = FP8Handoff(), torch.ones(2, 4), torch.zeros(2, 4), torch.ones(2, 1)
    handoff.put(x, rows, scales)
    assert handoff.take(x.clone()) is None
    assert handoff.take(x) is None  # the miss dropped them
    handoff.put(x, rows, scales)
    taken = handoff.take(x)
    assert taken[0] is rows and taken[1] is scales
    assert handoff.take(x) is None


def loaded(model):
    """Random E4M3 weights and their scales in every linear layer; norm gains near 1."""
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, LinearBase):
            q, scale = fp8.quantize_rows(torch.randn(m.weight.shape, generator=gen))
            m.weight.data.copy_(q)
            m.weight_scale.data.copy_(scale)
        elif isinstance(m, RMSNorm):
            m.weight.data.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=gen))
    return model


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU's path on the CPU: the fused kernels by torch (the norm or activation, then
    fp8.quantize_rows), the FP8 GEMM by the dequantized one, recording the rows it got."""
    gemm_inputs = []

    def gemm(x, weight, scale, bias, x_fp8=None):
        gemm_inputs.append(x_fp8)
        return F.linear(x, fp8.dequantize(weight, scale, x.dtype), bias)

    def norm_fp8(x, residual, weight, eps):
        out, new_x = add_rms_norm_torch(x, residual, weight, eps)
        return (out, new_x, *fp8.quantize_rows(out))

    def act_fp8(x, blocks=1):
        out = silu_and_mul_torch(x)
        return (out, *fp8.quantize_rows(out))
    monkeypatch.setattr(fp8_input, "use_triton", lambda x: True)
    monkeypatch.setattr(fp8, "_runs_fp8_gemm", lambda *args: True)
    monkeypatch.setattr(fp8_gemm, "quantizes_activations", lambda rows, *args: rows > 4)
    monkeypatch.setattr(fp8_gemm, "linear", gemm)
    monkeypatch.setattr(rmsnorm, "rms_norm_fp8", norm_fp8)
    monkeypatch.setattr(silu_mul, "silu_and_mul_fp8", act_fp8)
    return gemm_inputs


def test_layers_take_the_rows_made_with_their_input(gpu_stand_ins):
    layer = loaded(build()).model.layers[0]
    gen = torch.Generator().manual_seed(1)
    h, residual = torch.randn(2, 6, 64, generator=gen).unbind()
    norm = layer.post_attention_layernorm
    x, new_residual = norm(h, residual)
    made = norm.handoff._held
    assert made[0] is x
    layer.mlp(x)
    gate_up_rows, down_rows = gpu_stand_ins
    assert gate_up_rows[0] is made[1] and gate_up_rows[1] is made[2]
    act_out = silu_and_mul_torch(layer.mlp.gate_up_proj(x))
    assert all(torch.equal(a.float(), b.float())
               for a, b in zip(down_rows, fp8.quantize_rows(act_out)))
    expected = add_rms_norm_torch(h, residual, norm.weight, norm.eps)
    assert torch.equal(x, expected[0]) and torch.equal(new_residual, expected[1])


def test_layers_quantize_for_themselves_what_was_changed_or_not_handed_over(gpu_stand_ins):
    layer = loaded(build()).model.layers[0]
    gen = torch.Generator().manual_seed(1)
    h, residual = torch.randn(2, 6, 64, generator=gen).unbind()
    x, _ = layer.post_attention_layernorm(h, residual)
    layer.mlp.gate_up_proj(x.clone())  # as SiDP's gather gives the layer another tensor
    assert gpu_stand_ins == [None]
    assert layer.post_attention_layernorm.handoff._held is None  # not kept for a later call
    gpu_stand_ins.clear()
    layer.post_attention_layernorm(h[:4], residual[:4])  # 4 rows: the GEMV's, unquantized
    assert layer.post_attention_layernorm.handoff._held is None
    layer.mlp(torch.randn(4, 64, generator=gen))
    assert gpu_stand_ins == [None, None]


@pytest.fixture(scope="module")
def fp8_engine_outputs(tiny_llama_dir):
    """The FP8 engine's outputs on the GPU without and with the fused kernels, in one process
    (the FP8 GEMMs' choices per shape, measured once, are shared), and the calls of the fused
    kernels by the second."""
    prompts, _ = requests(8)  # 1-90 tokens each: prefills of more than 64 rows
    calls = {"norm": 0, "act": 0}
    norm_fp8, act_fp8 = rmsnorm.rms_norm_fp8, silu_mul.silu_and_mul_fp8
    outputs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rmsnorm, "rms_norm_fp8", lambda *a: calls.update(
            norm=calls["norm"] + 1) or norm_fp8(*a))
        patch.setattr(silu_mul, "silu_and_mul_fp8", lambda *a: calls.update(
            act=calls["act"] + 1) or act_fp8(*a))
        for mode in ("0", "1"):
            patch.setenv("PARASHIFT_FP8_FUSED_INPUT", mode)
            llm = tiny_llm(tiny_llama_dir, device=DEVICE, dtype="bfloat16", quantization="fp8",
                           max_num_seqs=8)  # few graphs to capture
            try:
                outputs.append(llm.generate(prompts, GREEDY))
            finally:
                llm.llm_engine.shutdown()
    return outputs, calls


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_fused_fp8_inputs_give_the_unfused_tokens_and_logprobs(fp8_engine_outputs):
    (unfused, fused), calls = fp8_engine_outputs
    assert calls["norm"] > 0 and calls["act"] > 0
    assert_identical(fused, unfused)
