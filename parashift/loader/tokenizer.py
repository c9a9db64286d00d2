"""Tokenizer (and chat template) from the HF directory or the GGUF, via transformers."""
from parashift.loader.source import ModelSource


def load_tokenizer(source: ModelSource, tokenizer: str | None = None):
    from transformers import AutoTokenizer
    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(tokenizer)
    if source.kind == "gguf":
        return _gguf_tokenizer(source)
    if source.kind == "hf":
        return AutoTokenizer.from_pretrained(source.path)
    return None  # random weights: token-id prompts only, unless a tokenizer is named


def _gguf_tokenizer(source: ModelSource):
    """AutoTokenizer would first rebuild the model config through transformers' full
    GGUF parse (seconds); a GGUF always holds a fast (tokenizers) vocabulary, so the
    fast class is asked directly."""
    from transformers import PreTrainedTokenizerFast
    try:
        return PreTrainedTokenizerFast.from_pretrained(source.path.parent,
                                                       gguf_file=source.path.name)
    except Exception as e:
        raise ValueError(f"cannot load the tokenizer of GGUF file {source.path}: {e}") from None
