"""Tokenizer (and chat template) from the HF directory or the GGUF, via transformers."""
from parashift.loader.source import ModelSource


def load_tokenizer(source: ModelSource, tokenizer: str | None = None):
    from transformers import AutoTokenizer
    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(tokenizer)
    if source.kind == "gguf":
        return AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
    if source.kind == "hf":
        return AutoTokenizer.from_pretrained(source.path)
    return None  # random weights: token-id prompts only, unless a tokenizer is named
