"""SmolLM2-135M-Instruct from the embedded GGUF matches Hugging Face transformers
loading the same file (both dequantize Q4_1 to fp32)."""
import os

import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.loader.source import embedded_gguf_path
from tests.helpers.hf_smollm2 import hf_smollm2
from tests.helpers.parity import hf_greedy, hf_prompt_logits, max_relative_diff, prompt_logits

pytestmark = pytest.mark.usefixtures("single_torch_thread")
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu", dtype="float32", num_blocks=64, max_model_len=1024,
               attention_backend="torch", enable_prefix_caching=False)


@pytest.fixture(scope="module")
def hf_model():
    return hf_smollm2()


@pytest.fixture(scope="module")
def chat_prompt(llm) -> list[int]:
    return llm.llm_engine.apply_chat_template(CHAT)


def test_config_matches_transformers(llm, hf_model):
    ours, theirs = llm.llm_engine.runner.model.config, hf_model.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)


def test_prompt_logits_match(llm, hf_model, chat_prompt):
    ours, theirs = prompt_logits(llm, chat_prompt), hf_prompt_logits(hf_model, chat_prompt)
    assert ours.shape == theirs.shape
    assert max_relative_diff(ours, theirs) < 1e-4
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_chat_answer_matches(llm, hf_model, chat_prompt):
    out = llm.generate([chat_prompt], GREEDY)[0].outputs[0]
    assert out.text.startswith("The capital of France is Paris.")
    assert out.token_ids == hf_greedy(hf_model, chat_prompt, NEW_TOKENS)


def test_text_prompts_match(llm, hf_model):
    tokenizer = llm.get_tokenizer()
    prompts = ["Once upon a time, in a small village,", "def fibonacci(n):"]
    outputs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outputs):
        ids = tokenizer.encode(prompt)
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == hf_greedy(hf_model, ids, NEW_TOKENS)


def test_tokenizer_matches_transformers(llm):
    from transformers import AutoTokenizer
    path = embedded_gguf_path()
    reference = AutoTokenizer.from_pretrained(os.fspath(path.parent), gguf_file=path.name)
    ours = llm.get_tokenizer()
    text = "Héllo wörld! 123 <|im_start|>user\n  tabs\tand emoji 🙂"
    assert ours.encode(text) == reference.encode(text)
    assert ours.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                    return_dict=False) == \
        reference.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
    assert ours.eos_token_id == reference.eos_token_id
