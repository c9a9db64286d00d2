"""Mixtures of experts (Qwen3-MoE, Mixtral) in parashift compute what Hugging Face
transformers computes: tiny random checkpoints, fp32 on the CPU."""
from pathlib import Path

import pytest
import torch

from parashift.layers.fused_moe import FusedExperts
from tests.helpers.parity import (GREEDY, NEW_TOKENS, assert_prompt_logits_match, hf_greedy,
                                  load, random_prompt)
from tests.helpers.tiny_configs import MOE_FAMILIES, save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("single_torch_thread")
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"


@pytest.fixture(scope="module", params=sorted(MOE_FAMILIES))
def pair(request, tmp_path_factory):
    """(HF model, parashift LLM) of one family's tiny checkpoint."""
    directory = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_checkpoint(request.param, directory)
    return hf, load(directory)


def first_experts(llm) -> FusedExperts:
    return next(m for m in llm.llm_engine.runner.model.modules() if isinstance(m, FusedExperts))


def test_per_expert_tensors_fill_the_stacked_parameters(pair):
    """The checkpoint holds one tensor per expert and matrix (w1/w3/w2 for Mixtral); the
    loader stacks them as HF's fused [gate | up] and down parameters."""
    hf, llm = pair
    ours = first_experts(llm)
    theirs = hf.model.layers[0].mlp.experts
    assert torch.equal(ours.gate_up_proj, theirs.gate_up_proj)
    assert torch.equal(ours.down_proj, theirs.down_proj)


def test_prompt_logits_match(pair):
    hf, llm = pair
    assert_prompt_logits_match(hf, llm, random_prompt(45, seed=1))


def routed_experts(llm) -> list[set[int]]:
    """A recorder: for every forward of the first MoE layer, the experts it routed to."""
    experts = first_experts(llm)
    seen: list[set[int]] = []
    experts.register_forward_hook(lambda _m, args, _out: seen.append(set(args[2].unique().tolist())))
    return seen


def test_greedy_continuation_matches_with_idle_experts(pair):
    """32 greedy tokens as HF's, in one batch of prefills and decodes; decode steps of
    one sequence leave most experts without a token, the prefill uses them all."""
    hf, llm = pair
    seen = routed_experts(llm)
    prompts = [random_prompt(n, seed=n) for n in (5, 17, 40)]
    outputs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
    num_experts = first_experts(llm).num_experts
    assert max(len(s) for s in seen) == num_experts
    single = llm.generate([random_prompt(9, seed=9)], GREEDY)[0]
    assert len(single.outputs[0].token_ids) == NEW_TOKENS
    assert min(len(s) for s in seen) <= 2 < num_experts  # top-2 of one token: idle experts


def test_random_weights_from_a_shape_file(tmp_path):
    """A config .json alone (benchmarks/shapes/) loads with random weights and generates."""
    import json
    cfg = MOE_FAMILIES["qwen3-moe"]().to_dict()
    shape = tmp_path / "tiny-qwen3-moe.json"
    shape.write_text(json.dumps({**cfg, "architectures": ["Qwen3MoeForCausalLM"]}))
    llm = load(shape)
    experts = first_experts(llm)
    assert experts.gate_up_proj.shape == (8, 64, 64)
    assert experts.gate_up_proj.std() > 0
    out = llm.generate([random_prompt(8, seed=2)], GREEDY)[0]
    assert len(out.outputs[0].token_ids) == NEW_TOKENS


def test_qwen3_30b_a3b_shape_reads():
    """The benchmark shape names a supported architecture with the expert sizes read."""
    from parashift.loader.source import load_hf_config, resolve_model
    from parashift.models.moe import expert_shape
    cfg = load_hf_config(resolve_model(SHAPES / "qwen3-30b-a3b.json"))
    shape = expert_shape(cfg)
    assert (shape.num_experts, shape.top_k, shape.intermediate_size) == (128, 8, 768)
