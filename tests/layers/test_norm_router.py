"""The post-attention norm that routes for the MoE after it (layers/norm_router.py): which
norms get the twin, that the MoE takes a handed routing only for the very tensor (CPU, the
kernel stood in by torch), and on the GPU (PARASHIFT_TEST_DEVICE=cuda) a Qwen3-MoE engine's
greedy tokens at batch 1 with PARASHIFT_MOE_NORM_ROUTER=1 (the default) equal to those with
0."""
import os

import pytest
import torch

from parashift.context import use_state
from parashift.kernels import moe_norm_router
from parashift.layers.fused_moe import FusedExperts, FusedMoE, Router
from parashift.layers.layernorm import RMSNorm
from parashift.layers.norm_router import NormRouter
from parashift.layers.split_parts_norm import PartsRMSNorm
from parashift.models.moe import MoeForCausalLM
from parashift.parallel.state import ParallelState
from tests.engine.conftest import tiny_llm
from tests.helpers.tiny_configs import randomize, save_tiny_checkpoint, tiny_config

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def build(**context) -> MoeForCausalLM:
    """The tiny Qwen3-MoE on the CPU, its parameters random (none left unwritten)."""
    with use_state(ParallelState.single(), **context):
        model = MoeForCausalLM(tiny_config("qwen3-moe"), 64)
    randomize(model)
    return model


def test_each_moe_layer_norm_gets_the_twin():
    """Qwen3-MoE's layer 1 is dense (mlp_only_layers): its norm stays plain (or the twin
    summing o_proj's split parts, layers/split_parts_norm.py)."""
    layers = build().model.layers
    kinds = [type(layer.post_attention_layernorm) for layer in layers]
    assert kinds == [NormRouter, PartsRMSNorm, NormRouter]
    assert not any(isinstance(layer.input_layernorm, NormRouter) for layer in layers)
    assert build(reduction_chunks=4).model.layers[0].mlp.fused_router() is None


def test_the_moe_takes_a_handed_routing_for_that_tensor_only(monkeypatch):
    """The kernel and the experts stood in (no CPU GEMM: the GPU machine's CPU route gave
    NaNs here): the experts run on the routing handed over, for that very tensor only."""
    layer = build().model.layers[0]
    norm, moe = layer.post_attention_layernorm, layer.mlp
    x, residual = torch.randn(2, 1, moe.gate.weight.shape[1]).unbind(0)
    plain_out, plain_new = RMSNorm.forward(norm, x, residual)
    monkeypatch.setenv(moe_norm_router.ENV, "1")
    monkeypatch.setattr("parashift.layers.norm_router.use_triton", lambda t: True)
    handed = torch.tensor([[0.75, 0.25]]), torch.tensor([[3, 1]])
    monkeypatch.setattr(moe_norm_router, "norm_router",
                        lambda x, residual, *a: (*RMSNorm.forward(norm, x, residual), *handed))
    runs = []
    monkeypatch.setattr(FusedExperts, "forward",
                        lambda self, x, weights, ids: runs.append((weights, ids)) or x)
    monkeypatch.setattr(Router, "route", lambda self, x, k, renormalize: ("own", "routing"))
    out, new_x = norm(x, residual)
    assert torch.equal(out, plain_out) and torch.equal(new_x, plain_new)
    assert moe(out) is out and runs[-1][0] is handed[0] and runs[-1][1] is handed[1]
    moe(out)  # taken once: the next call routes itself
    assert runs[-1] == ("own", "routing")
    norm(x, residual)
    with pytest.raises(RuntimeError, match="another tensor"):
        moe(out.clone())
    monkeypatch.setenv(moe_norm_router.ENV, "0")
    assert torch.equal(norm(x, residual)[0], plain_out)
    moe(plain_out)
    assert runs[-1] == ("own", "routing")


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_engine_tokens_at_batch_one_with_and_without(tmp_path, monkeypatch):
    from tests.deterministic.test_batch_invariance import GREEDY, requests
    save_tiny_checkpoint("qwen3-moe", tmp_path)
    prompts, _ = requests(3)
    calls = []
    launch = moe_norm_router.norm_router
    monkeypatch.setattr(moe_norm_router, "norm_router",
                        lambda *a: calls.append(1) or launch(*a))
    tokens = {}
    for value in ("0", "1"):
        monkeypatch.setenv(moe_norm_router.ENV, value)
        llm = tiny_llm(tmp_path, device="cuda", dtype="bfloat16", max_num_seqs=1)
        try:
            tokens[value] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        finally:
            llm.llm_engine.shutdown()
    assert calls and tokens["1"] == tokens["0"]
