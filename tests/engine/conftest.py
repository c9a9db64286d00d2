import pytest
import torch

from parashift import LLM


def save_tiny_llama(directory, **overrides) -> str:
    """A tiny random Llama with peaked logits (large init), saved the HF way."""
    from transformers import LlamaConfig, LlamaForCausalLM
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 initializer_range=0.2, tie_word_embeddings=False)
    config = LlamaConfig(**{**shape, **overrides})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def tiny_llm(model_dir, **options) -> LLM:
    defaults = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=256)
    return LLM(model=model_dir, **{**defaults, **options})


@pytest.fixture(scope="session")
def smollm2() -> LLM:
    return LLM(device="cpu", dtype="float32")
