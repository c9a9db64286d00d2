"""The split-K GEMM whose parts the norm after it sums (layers/split_parts_norm.py): which
pairs are wired (CPU), the handoff by the very tensor, the switch read at each call, and on
the GPU (PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens with the parts forced on equal
to those without, bf16 and FP8, at 33-64 rows."""
import os

import pytest
import torch

from parashift.context import use_state
from parashift.kernels import split_parts_choice
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.layernorm import RMSNorm
from parashift.layers.linear import WeightPart
from parashift.layers.split_parts_norm import PartsHandoff, PartsOutHook, PartsQuantizingRMSNorm, \
    PartsRMSNorm
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def build(quantization=None):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**TINY, tie_word_embeddings=False)
    with use_state(ParallelState.single(), quantization=quantization):
        return LlamaForCausalLM(cfg, 64)


@pytest.mark.parametrize("quantization, twin", [(None, PartsRMSNorm),
                                                (WeightQuant(), PartsQuantizingRMSNorm)],
                         ids=["bf16", "fp8"])
def test_post_attention_norm_and_o_proj_are_wired(monkeypatch, quantization, twin):
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")
    model = build(quantization)
    names = dict(model.named_parameters())
    layers = model.model.layers
    for i, layer in enumerate(layers):
        assert type(layer.post_attention_layernorm) is twin
        assert isinstance(layer.self_attn.o_proj.gemm_hook, PartsOutHook)
        assert isinstance(layer.mlp.down_proj.gemm_hook, PartsOutHook)
        assert layer.self_attn.qkv_proj.gemm_hook is None
        assert f"model.layers.{i}.post_attention_layernorm.weight" in names
        assert f"model.layers.{i}.input_layernorm.weight" in names
    # down -> the next layer's input norm (the first layer's has no residual: plain), the
    # last layer's down -> the final norm (the LM head takes no FP8 input: a plain twin)
    assert type(layers[0].input_layernorm) in (RMSNorm, QuantizingRMSNorm)
    assert all(type(layer.input_layernorm) is twin for layer in layers[1:])
    assert type(model.model.norm) is PartsRMSNorm


def test_handoff_gives_the_parts_for_the_very_tensor_only():
    handoff, placeholder, parts = PartsHandoff(), torch.empty(2, 4), (torch.zeros(2, 2, 4),)
    assert handoff.take(placeholder) is None
    handoff.put(placeholder, parts)
    assert handoff.take(placeholder) is parts
    assert handoff.take(placeholder) is None  # taken once
    handoff.put(placeholder, parts)
    with pytest.raises(RuntimeError, match="another tensor"):
        handoff.take(placeholder.clone())


def test_switch_is_read_at_each_call_and_checked(monkeypatch):
    hook = build().model.layers[0].self_attn.o_proj.gemm_hook
    part = WeightPart(torch.randn(64, 64), None)
    monkeypatch.setenv(split_parts_choice.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_SPLIT_PARTS_NORM='yes'"):
        hook.take(torch.randn(40, 64), part)
    monkeypatch.setenv(split_parts_choice.ENV, "1")
    monkeypatch.setattr(split_parts_choice, "choice",
                        lambda *args: pytest.fail("asked on the CPU"))
    assert hook.take(torch.randn(40, 64), part) is None  # the CPU: the plain GEMM


def test_the_wired_model_computes_as_before_on_the_cpu(monkeypatch):
    monkeypatch.setenv(split_parts_choice.ENV, "1")
    layer = build().model.layers[0]
    gen = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x, residual = torch.randn(40, 64), torch.randn(40, 64)
    out, new_residual = layer.post_attention_layernorm(layer.self_attn.o_proj(x), residual)
    expected_x = x @ layer.self_attn.o_proj.weight.t() + residual
    torch.testing.assert_close(new_residual, expected_x)
    torch.testing.assert_close(out, RMSNorm.forward(layer.post_attention_layernorm,
                                                    expected_x))


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """tokens(quantization, value): greedy tokens with PARASHIFT_SPLIT_PARTS_NORM=value,
    40 sequences a step (decode's 64-row bucket)."""
    return switch_tokens(tiny_llama_dir, DEVICE, split_parts_choice.ENV, prompts=40,
                         max_num_seqs=64)


class TicketTwins(dict):
    """A GEMM module's choices, with `config` (a split-K config, its parts summed by tickets)
    for the pairs' weights (`shapes`) at decode's 33-64-row bucket (`bucket`)."""

    def __init__(self, choices: dict, shapes: set, bucket: int, config):
        super().__init__(choices)
        self._forced = lambda key: key[0] == bucket and key[1] in shapes
        self._config = config
        self.used = set()  # the shapes that took it

    def __contains__(self, key):
        return self._forced(key) or super().__contains__(key)

    def __getitem__(self, key):
        if not self._forced(key):
            return super().__getitem__(key)
        self.used.add(key[1])
        return self._config


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_parts_engine_gives_the_ticket_path_tokens(engine_tokens, monkeypatch, quantization):
    """Every pair at 40 rows on a split-K config's parts (whatever they time) gives the tokens
    of the same config summed by tickets with the plain norms: the same bits (the default
    GEMM, unsplit, sums in another order, so a tiny random model's near ties may differ)."""
    from parashift.kernels import dense_gemm, fp8_gemm
    fp8 = quantization == "fp8"
    parts = (split_parts_choice.FP8_CONFIGS if fp8 else split_parts_choice.DENSE_CONFIGS)[0]
    ticket = fp8_gemm.Config(**{**parts.__dict__, "tickets": True}) if fp8 else parts
    hidden, inter, heads = TINY["hidden_size"], TINY["intermediate_size"], TINY[
        "num_attention_heads"]
    shapes = {(hidden, hidden // heads * heads), (hidden, inter)}  # o_proj, down
    gemm = fp8_gemm if fp8 else dense_gemm
    asked = set()
    monkeypatch.setattr(split_parts_choice, "choice",
                        lambda x, weight, *args: asked.add(tuple(weight.shape)) or parts)
    on = engine_tokens(quantization, "1")
    twins = TicketTwins(gemm._choices, shapes, gemm.row_bucket(40), ticket)
    monkeypatch.setattr(gemm, "_choices", twins)
    assert on == engine_tokens(quantization, "0")
    assert asked == shapes and twins.used == shapes


def test_a_norm_replaced_later_leaves_the_hook_idle():
    """Qwen3-MoE's routing norm wraps the twin in its sparse layers (0 and 2): their o_proj
    hands over no parts; the dense layer 1 keeps the pair."""
    from parashift.models.moe import MoeForCausalLM
    from tests.helpers.tiny_configs import tiny_config
    with use_state(ParallelState.single()):
        layers = MoeForCausalLM(tiny_config("qwen3-moe"), 64).model.layers
    assert [layer.self_attn.o_proj.gemm_hook._wired() for layer in layers] == [False, True,
                                                                                False]


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: the parts chosen, K split in two by torch, the summing norm
    by torch; the parts each norm summed recorded."""
    from parashift.kernels import parts_rmsnorm
    from parashift.layers import split_parts_norm
    from parashift.layers.layernorm import add_rms_norm_torch
    summed = []

    def parts_of(x, weight, scale, config, x_fp8=None):
        half = x.shape[1] // 2
        return (torch.stack([x[:, :half] @ weight[:, :half].t(),
                             x[:, half:] @ weight[:, half:].t()]).float(), None, None)

    def parts_add_rms_norm(parts, w_scale, x_scale, residual, weight, eps, quant=False):
        summed.append(parts)
        return add_rms_norm_torch(parts.sum(0).to(residual.dtype), residual, weight, eps)

    monkeypatch.setenv(split_parts_choice.ENV, "1")
    monkeypatch.setattr(split_parts_norm, "use_triton", lambda x: True)
    monkeypatch.setattr(split_parts_choice, "serves", lambda *args: True)
    monkeypatch.setattr(split_parts_choice, "choice", lambda *args: "cfg")
    monkeypatch.setattr(split_parts_choice, "parts_of", parts_of)
    monkeypatch.setattr(parts_rmsnorm, "parts_add_rms_norm", parts_add_rms_norm)
    return summed


def test_the_layers_hand_their_parts_to_the_norms_after(gpu_stand_ins, monkeypatch):
    """o_proj -> post-attention norm and down -> the next layer's input norm (then the last
    down -> the final norm): the layer returns an unwritten tensor and the norm sums the
    parts it was handed, the plain pair's result."""
    model = build()
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    layers, x, residual = model.model.layers, torch.randn(40, 64), torch.randn(40, 64)
    pairs = [(layers[0].self_attn.o_proj, layers[0].post_attention_layernorm),
             (layers[0].mlp, layers[1].input_layernorm), (layers[1].mlp, model.model.norm)]
    for producer, norm in pairs:
        monkeypatch.setenv(split_parts_choice.ENV, "0")
        expected = norm(producer(x), residual)
        assert not gpu_stand_ins
        monkeypatch.setenv(split_parts_choice.ENV, "1")
        out = norm(producer(x), residual)
        assert len(gpu_stand_ins) == 1 and gpu_stand_ins.pop().shape == (2, 40, 64)
        torch.testing.assert_close(out, expected)
        with pytest.raises(RuntimeError, match="another tensor"):
            producer(x)
            norm(x, residual)


def test_a_forward_hook_between_the_layer_and_its_norm_leaves_the_hook_idle(gpu_stand_ins):
    """SiDP's CaS hooks an FFN block (gathers its rows, reduce-scatters its output): down's
    unwritten output would be read, so down finishes its own sum there; o_proj, outside that
    block, keeps its parts."""
    model = build()
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    layers, x, residual = model.model.layers, torch.randn(40, 64), torch.randn(40, 64)
    handle = layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    expected = layers[1].input_layernorm(layers[0].mlp(x) / 2 * 2, residual)
    assert not gpu_stand_ins
    torch.testing.assert_close(layers[1].input_layernorm(layers[0].mlp(x), residual), expected)
    layers[0].post_attention_layernorm(layers[0].self_attn.o_proj(x), residual)
    assert len(gpu_stand_ins) == 1  # o_proj's parts only
    handle.remove()
    layers[1].input_layernorm(layers[0].mlp(x), residual)
    assert len(gpu_stand_ins) == 2
