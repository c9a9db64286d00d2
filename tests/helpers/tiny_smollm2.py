"""A tiny random Llama that reads and writes through the embedded SmolLM2's tokenizer (its
vocabulary, special tokens and chat template), for tests of the server's surface: what the
model answers does not matter there, and each of SmolLM2's decode steps reads 540 MB of
float32 weights."""
import os

from tests.conftest import smollm2_gguf_path
from tests.engine.conftest import save_tiny_llama


def save_tiny_smollm2(directory, max_position_embeddings: int = 2048) -> str:
    from transformers import AutoTokenizer
    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                              gguf_file=os.path.basename(path))
    save_tiny_llama(directory, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    max_position_embeddings=max_position_embeddings)
    tokenizer.save_pretrained(directory)
    return str(directory)
