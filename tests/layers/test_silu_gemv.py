"""SiLU-and-mul inside the gate_up GEMV (layers/silu_gemv.py): which models fuse, that the MLP
gives the plain output with what was handed over (CPU, the GPU's kernels stood in by torch),
and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens with the fusion equal
to those without, bf16 and FP8."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.context import use_state
from parashift.kernels import gated_gemv
from parashift.layers import silu_gemv
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.silu_gemv import SiluIntoGemv, fuse_silu_into_gemv
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def build(quantization=None, **context):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**TINY, tie_word_embeddings=False)
    with use_state(ParallelState.single(), quantization=quantization, **context):
        return LlamaForCausalLM(cfg, 64)


def twins(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, SiluIntoGemv)]


def test_gate_up_by_default_and_a_bad_switch_is_an_error(monkeypatch):
    monkeypatch.delenv(silu_gemv.ENV, raising=False)
    assert twins(build())
    monkeypatch.setenv(silu_gemv.ENV, "0")
    assert not twins(build())
    for bad in ("yes", "down"):  # down: the place removed in session 51
        monkeypatch.setenv(silu_gemv.ENV, bad)
        with pytest.raises(ValueError, match=f"PARASHIFT_SILU_GEMV='{bad}'"):
            build()


@pytest.mark.parametrize("quantization", [None, WeightQuant()], ids=["bf16", "fp8"])
def test_each_mlp_hooks_its_gate_up_layer(monkeypatch, quantization):
    monkeypatch.setenv(silu_gemv.ENV, "gate_up")
    if quantization is not None:  # fp8_input.py's quantizing twin, where on, stays
        monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "1")
        assert not twins(build(quantization))
        monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "0")
    model = build(quantization)
    assert twins(model) == [f"model.layers.{i}.mlp.act" for i in range(TINY["num_hidden_layers"])]
    for layer in model.model.layers:
        assert isinstance(layer.mlp.gate_up_proj.gemm_hook, silu_gemv.GateUpHook)
        # down keeps no SiLU hook (it may hold split_parts_norm.py's)
        assert not isinstance(layer.mlp.down_proj.gemm_hook, silu_gemv.GateUpHook)
    assert not twins(build(reduction_chunks=4))  # deterministic mode: its own GEMMs
    assert not twins(build(WeightQuant(serialized=True, static_activations=True)))
    assert fuse_silu_into_gemv(model) == 0  # twins are not replaced again


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: a fusion chosen for up to 4 rows, the fused GEMVs by torch,
    recording their calls."""
    calls = []

    def fused_linear(x, weight, scale, bias, config):
        calls.append("gate_up")
        return silu_and_mul_torch(F.linear(x, weight, bias))
    monkeypatch.setattr(silu_gemv, "use_triton", lambda x: True)
    monkeypatch.setattr(gated_gemv, "choice",
                        lambda x, *args: "cfg" if x.shape[0] <= 4 else None)
    monkeypatch.setattr(gated_gemv, "fused_linear", fused_linear)
    return calls


def test_the_mlp_gives_the_plain_output_fused(monkeypatch, gpu_stand_ins):
    monkeypatch.setenv(silu_gemv.ENV, "gate_up")
    mlp = build().model.layers[0].mlp
    gen = torch.Generator().manual_seed(0)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x = torch.randn(3, 64, generator=gen)
    expected = F.linear(silu_and_mul_torch(F.linear(x, mlp.gate_up_proj.weight)),
                        mlp.down_proj.weight)
    torch.testing.assert_close(mlp(x), expected, rtol=1e-6, atol=1e-6)
    assert gpu_stand_ins == ["gate_up"] and mlp.act.activated is None
    torch.testing.assert_close(mlp(x.repeat(2, 1)), expected.repeat(2, 1), rtol=1e-4,
                               atol=1e-5)  # 6 rows: the plain ops, no GEMV
    assert gpu_stand_ins == ["gate_up"]


def test_the_twin_is_the_plain_op_on_the_cpu(monkeypatch):
    monkeypatch.setenv(silu_gemv.ENV, "gate_up")
    mlp = build().model.layers[0].mlp
    gen = torch.Generator().manual_seed(0)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    monkeypatch.setattr(gated_gemv, "choice", lambda *args: pytest.fail("asked on the CPU"))
    x = torch.randn(2, 64)
    expected = F.linear(silu_and_mul_torch(mlp.gate_up_proj(x)), mlp.down_proj.weight)
    torch.testing.assert_close(mlp(x), expected)


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """tokens(quantization, mode): greedy tokens with PARASHIFT_SILU_GEMV=mode."""
    return switch_tokens(tiny_llama_dir, DEVICE, silu_gemv.ENV)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_fused_engine_gives_the_unfused_tokens(engine_tokens, quantization):
    assert engine_tokens(quantization, "gate_up") == engine_tokens(quantization, "0")
