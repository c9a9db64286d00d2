"""FP8 activations made by the op before an FP8 linear layer: which ops of a model hand them
over, that the layer takes them only with the tensor they were made of (CPU, the GPU's
kernels and GEMM stood in by torch), and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an FP8
engine's greedy tokens and logprobs with the fused kernels equal to those without (and with
the attention's output rows, PARASHIFT_ATTN_O_FP8, equal to those without)."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.attention import fp8_output
from parashift.context import use_state
from parashift.kernels import fp8_gemm, rmsnorm, silu_mul
from parashift.layers import fp8_attention_output, fp8_input
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.attention import Attention
from parashift.layers.fp8_attention_output import QuantizingAttention
from parashift.layers.fp8_handoff import FlattenedHandoff
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
    kinds = (QuantizingRMSNorm, QuantizingSiluAndMul, QuantizingAttention)
    return {name: next(kind for kind in kinds if isinstance(m, kind))
            for name, m in model.named_modules() if isinstance(m, kinds)}


@pytest.fixture(autouse=True)
def fused(monkeypatch):
    """The fusion on, whatever the environment says; the norms not wrapped by
    layers/norm_gemv.py's twins (which fall back on these: tests/layers/test_norm_gemv.py)."""
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")
    monkeypatch.setenv("PARASHIFT_NORM_IN_GEMV", "0")


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
                 (layer.mlp.act, layer.mlp.down_proj),
                 (layer.self_attn.attn, layer.self_attn.o_proj)]
        for producer, consumer in pairs:
            assert isinstance(producer, (QuantizingRMSNorm, QuantizingSiluAndMul,
                                         QuantizingAttention))
            assert producer.handoff is consumer.fp8_input
        assert isinstance(layer.self_attn.o_proj.fp8_input, FlattenedHandoff)
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
    expected = {f"model.layers.{i}.{name}" for i in range(cfg.num_hidden_layers)
                for name in ("input_layernorm", "self_attn.attn")}
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
                        ("attn", {QuantizingAttention}),
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


def test_a_flattened_handoff_gives_its_rows_for_the_output_or_its_flattened_view():
    x, rows, scales = torch.ones(2, 3, 4), torch.zeros(2, 12), torch.ones(2, 1)
    for given, taken in [(x, True), (x.flatten(-2), True), (x.clone().flatten(-2), False),
                         (x.transpose(1, 2).flatten(-2), False), (x.flatten(), False)]:
        handoff = FlattenedHandoff()
        handoff.put(x, rows, scales)
        assert (handoff.take(given) is not None) == taken
        assert handoff.take(x) is None  # taken once, or dropped by the miss


def test_the_attention_twin_is_the_layer_itself():
    """Re-classed, not copied: the FP8 pool's scale loaders and the runner's KV binding reach
    it, and its parameters keep their names."""
    with use_state(ParallelState.single(), kv_fp8=True):
        attn = Attention(4, 2, 16, 0.25, rotary_emb=torch.nn.Identity())
    before = dict(attn.named_parameters())
    consumer = build().model.layers[0].self_attn.o_proj
    twin = QuantizingAttention(attn, consumer)
    assert twin is attn and type(attn) is QuantizingAttention
    assert dict(attn.named_parameters()) == before and consumer.fp8_input is twin.handoff
    attn.k_scale.weight_loader(attn.k_scale, torch.tensor(0.5))  # bound to the layer
    assert attn.kv_scales[0] == 0.5


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


@pytest.fixture
def attention_stand_in(gpu_stand_ins, monkeypatch):
    """The attention on the CPU: its output a function of q, and where a request is open the
    rows and scales the unsplit decode launch would write (fp8.quantize_rows of it),
    recorded as its launch records them; returns what was made, per call."""
    made = []

    def attend(self, positions, q, k, v):
        out = q * 0.5
        request = fp8_output.pending()
        if request is not None:
            request.record(out, *fp8.quantize_rows(out.flatten(-2)))
        made.append(None if request is None else request.made)
        return out
    monkeypatch.setattr(Attention, "forward", attend)
    monkeypatch.setattr(fp8_attention_output, "use_triton", lambda x: True)
    monkeypatch.setenv(fp8_attention_output.ATTN_O_FP8_ENV, "1")
    return made


def test_o_proj_takes_the_rows_the_attention_made_of_its_output(gpu_stand_ins,
                                                                attention_stand_in):
    attn = loaded(build()).model.layers[0].self_attn
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(2))
    attn(torch.arange(6), x)
    (made,), (_, o_rows) = attention_stand_in, gpu_stand_ins
    assert o_rows[0] is made[1] and o_rows[1] is made[2]


def test_o_proj_quantizes_for_itself_where_the_attention_made_no_rows(
        gpu_stand_ins, attention_stand_in, monkeypatch):
    attn = loaded(build()).model.layers[0].self_attn
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp8_output, "pending", lambda: None)  # a launch that cannot
        attn(torch.arange(6), x)
    monkeypatch.setenv(fp8_attention_output.ATTN_O_FP8_ENV, "0")
    attn(torch.arange(6), x)  # the switch off: no request
    monkeypatch.setenv(fp8_attention_output.ATTN_O_FP8_ENV, "1")
    attn(torch.arange(4), x[:4])  # o_proj's GEMV at 4 rows: no request
    assert gpu_stand_ins == [None] * 6 and attention_stand_in == [None] * 3


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
            outputs.append(fp8_outputs(tiny_llama_dir, prompts))
    return outputs, calls


def fp8_outputs(model_dir, prompts):
    """The tiny FP8 engine's greedy outputs on DEVICE."""
    llm = tiny_llm(model_dir, device=DEVICE, dtype="bfloat16", quantization="fp8",
                   max_num_seqs=8)  # few graphs to capture
    try:
        return llm.generate(prompts, GREEDY)
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_fused_fp8_inputs_give_the_unfused_tokens_and_logprobs(fp8_engine_outputs):
    (unfused, fused), calls = fp8_engine_outputs
    assert calls["norm"] > 0 and calls["act"] > 0
    assert_identical(fused, unfused)


@pytest.fixture(scope="module")
def attention_rows_outputs(tiny_llama_dir):
    """The FP8 engine's outputs on the GPU with PARASHIFT_ATTN_O_FP8 off and on, every decode
    launch unsplit and every FP8 GEMM cuBLASLt's (which quantizes its input; no Triton
    candidate timed: none to compile), so that o_proj may take the attention's rows at every
    decode step; and the rows the launches made under each."""
    from parashift.attention import triton_backend
    prompts, _ = requests(8)
    made, outputs = {"0": 0, "1": 0}, []
    record = fp8_output.OutputRows.record
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_backend, "FUSED_UNSPLIT_PROGRAMS_PER_SM", 0)
        patch.setattr(fp8_gemm, "_choices", {})
        patch.setattr(fp8_gemm, "candidates", lambda rows, n: [])
        patch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")
        for mode in ("0", "1"):
            patch.setattr(fp8_output.OutputRows, "record", lambda self, *rows, mode=mode: (
                made.update({mode: made[mode] + 1}), record(self, *rows)))
            patch.setenv(fp8_attention_output.ATTN_O_FP8_ENV, mode)
            outputs.append(fp8_outputs(tiny_llama_dir, prompts))
    return outputs, made


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_the_attentions_fp8_rows_give_the_same_tokens_and_logprobs(attention_rows_outputs):
    (without, with_rows), made = attention_rows_outputs
    assert made["0"] == 0 and made["1"] > 0
    assert_identical(with_rows, without)
