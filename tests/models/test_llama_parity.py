"""The Llama family in parashift computes what Hugging Face transformers computes:
tiny random checkpoints of every supported variant, fp32 on the CPU."""
import pytest
import torch

from tests.helpers.parity import (GREEDY, NEW_TOKENS, assert_prompt_logits_match, hf_greedy,
                                  load, random_prompt)
from tests.helpers.tiny_configs import FAMILIES, save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    """(HF model, parashift LLM) of one family's tiny checkpoint."""
    directory = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_checkpoint(request.param, directory)
    return hf, load(directory)


def test_prompt_logits_match(pair):
    hf, llm = pair
    assert_prompt_logits_match(hf, llm, random_prompt(45, seed=1))


def test_greedy_continuation_matches(pair):
    hf, llm = pair
    prompts = [random_prompt(n, seed=n) for n in (5, 17, 40)]
    outputs = llm.generate(prompts, GREEDY)  # one batch: prefills and decodes share steps
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)


def test_chunked_prefill_matches(tmp_path):
    hf = save_tiny_checkpoint("llama3.1-rope-scaling", tmp_path)
    llm = load(tmp_path, max_num_batched_tokens=7)
    prompt = random_prompt(50, seed=3)
    out = llm.generate([prompt], GREEDY)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)


def test_sharded_checkpoint_matches(tmp_path):
    hf = save_tiny_checkpoint("qwen2-qkv-bias", tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").exists()
    llm = load(tmp_path)
    prompt = random_prompt(30, seed=4)
    assert_prompt_logits_match(hf, llm, prompt)
    out = llm.generate([prompt], GREEDY)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_qk_norms_taken_by_the_attention_layer_match(monkeypatch, tmp_path, device):
    """PARASHIFT_FUSED_QK_NORM: Qwen3's q/k norms inside the RoPE + KV-write kernel (CUDA) or
    applied by the attention layer (CPU): HF's prompt logits and greedy tokens."""
    from parashift.layers import attention
    monkeypatch.setattr(attention, "FUSED_QK_NORM", True)
    hf = save_tiny_checkpoint("qwen3-qk-norm-head-dim", tmp_path)
    llm = load(tmp_path, device=device)
    layers = [m for m in llm.llm_engine.runner.model.modules()
              if isinstance(m, attention.Attention)]
    assert layers and all(layer.qk_norms is not None for layer in layers)
    assert_prompt_logits_match(hf, llm, random_prompt(45, seed=1))
    prompt = random_prompt(17, seed=17)
    assert llm.generate([prompt], GREEDY)[0].outputs[0].token_ids == hf_greedy(hf, prompt,
                                                                               NEW_TOKENS)
