"""SiLU-and-mul inside the down projection's GEMV (layers/silu_down.py): which models fuse,
that the layer computes from the handed-over [gate | up] only when called with the twin's
very output (CPU, the GPU's kernels stood in by torch), and on the GPU
(PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens with the fusion equal to those
without, bf16 and FP8."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.context import use_state
from parashift.kernels import gated_gemv
from parashift.layers import silu_down
from parashift.layers.activation import SiluAndMul, silu_and_mul_torch
from parashift.layers.linear import LinearBase, WeightPart
from parashift.layers.silu_down import GatedHandoff, SiluIntoDown, fuse_silu_into_down
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.deterministic.test_batch_invariance import GREEDY, requests
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)
from tests.helpers.tiny_configs import TINY

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def build(quantization=None, **context):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**TINY, tie_word_embeddings=False)
    with use_state(ParallelState.single(), quantization=quantization, **context):
        return LlamaForCausalLM(cfg, 64)


def twins(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, SiluIntoDown)]


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv(silu_down.ENV, "1")


def test_off_by_default_and_a_bad_switch_is_an_error(monkeypatch):
    monkeypatch.delenv(silu_down.ENV, raising=False)
    assert not twins(build())
    monkeypatch.setenv(silu_down.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_SILU_DOWN='yes'"):
        build()


@pytest.mark.parametrize("quantization", [None, WeightQuant()], ids=["bf16", "fp8"])
def test_each_mlp_hands_its_down_projection_the_gate_and_up(fused, quantization):
    model = build(quantization)
    assert twins(model) == [f"model.layers.{i}.mlp.act" for i in range(TINY["num_hidden_layers"])]
    for layer in model.model.layers:
        assert layer.mlp.act.handoff is layer.mlp.down_proj.gated_input
    assert not twins(build(reduction_chunks=4))  # deterministic mode: its own GEMMs
    assert fuse_silu_into_down(model) == 0  # twins are not replaced again


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: a fused config chosen for up to 4 rows, the fused GEMV by
    torch (SiLU-and-mul, then the product), recording its calls."""
    calls = []

    def gated_linear(x, weight, scale, bias, config):
        calls.append(config)
        return F.linear(silu_and_mul_torch(x), weight, bias)
    monkeypatch.setattr(silu_down, "use_triton", lambda x: True)
    monkeypatch.setattr(gated_gemv, "choice", lambda x, *args: "cfg" if x.shape[0] <= 4 else None)
    monkeypatch.setattr(gated_gemv, "gated_linear", gated_linear)
    return calls


def test_the_down_projection_forms_the_product_it_was_handed(fused, gpu_stand_ins):
    mlp = build().model.layers[0].mlp
    gen = torch.Generator().manual_seed(0)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x = torch.randn(3, 64, generator=gen)
    expected = F.linear(silu_and_mul_torch(mlp.gate_up_proj(x)), mlp.down_proj.weight)
    torch.testing.assert_close(mlp(x), expected, rtol=1e-6, atol=1e-6)
    assert gpu_stand_ins == ["cfg"]
    torch.testing.assert_close(mlp(x.repeat(2, 1)), expected.repeat(2, 1), rtol=1e-4,
                               atol=1e-5)  # 6 rows: the plain op, no GEMV
    assert gpu_stand_ins == ["cfg"] and mlp.act.handoff._held is None


def test_a_handoff_computes_only_for_its_tensor_and_weight_once():
    handoff, weight = GatedHandoff(), torch.randn(8, 4)
    gate_up, placeholder = torch.randn(2, 8), torch.empty(2, 4)
    handoff.put(placeholder, gate_up, weight, "cfg")
    assert handoff.take(placeholder.clone(), WeightPart(weight, None)) is None
    assert handoff.take(placeholder, WeightPart(weight, None)) is None  # the miss dropped it
    handoff.put(placeholder, gate_up, weight, "cfg")
    assert handoff.take(placeholder, WeightPart(weight.clone(), None)) is None


def test_the_twin_is_the_plain_op_where_it_cannot_fuse(fused, monkeypatch):
    mlp = build().model.layers[0].mlp
    monkeypatch.setattr(gated_gemv, "choice", lambda *args: pytest.fail("asked on the CPU"))
    x = torch.randn(2, 256)
    assert torch.equal(mlp.act(x), silu_and_mul_torch(x))
    assert isinstance(mlp.act, SiluAndMul) and isinstance(mlp.down_proj, LinearBase)


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """Greedy tokens without and with the fusion, bf16 and FP8, and the fused calls."""
    prompts, _ = requests(8)
    tokens, calls = {}, []
    fused_linear = gated_gemv.gated_linear
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gated_gemv, "gated_linear", lambda *a: calls.append(1) or fused_linear(*a))
        for quantization in (None, "fp8"):
            for mode in ("0", "1"):
                patch.setenv(silu_down.ENV, mode)
                llm = tiny_llm(tiny_llama_dir, device=DEVICE, dtype="bfloat16",
                               quantization=quantization, max_num_seqs=4)
                try:
                    outs = llm.generate(prompts, GREEDY)
                    tokens[quantization, mode] = [o.outputs[0].token_ids for o in outs]
                finally:
                    llm.llm_engine.shutdown()
    return tokens, calls


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_fused_engine_gives_the_unfused_tokens(engine_tokens, quantization):
    tokens, calls = engine_tokens
    assert tokens[quantization, "1"] == tokens[quantization, "0"]
    assert gated_gemv.chosen()  # measured; whether a shape fused is the device's choice
