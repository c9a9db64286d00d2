"""Tokenizer (and chat template) from the HF directory or the GGUF, via transformers."""
from pathlib import Path

from parashift.loader.source import ModelSource

# Files one of which a Hugging Face tokenizer directory holds.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json",
                   "tekken.json")


def load_tokenizer(source: ModelSource, tokenizer: str | None = None,
                   trust_remote_code: bool = False):
    if tokenizer is not None:
        return _hf_tokenizer(Path(tokenizer).expanduser(), trust_remote_code)
    if source.kind == "gguf":
        return _gguf_tokenizer(source)
    if source.kind == "hf":
        return _hf_tokenizer(source.path, trust_remote_code)
    return None  # random weights: token-id prompts only, unless a tokenizer is named


def _hf_tokenizer(directory: Path, trust_remote_code: bool):
    from transformers import AutoTokenizer
    if directory.is_dir() and not any((directory / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(f"{directory} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}):"
                         " add one, name another with --tokenizer, or pass "
                         "--skip-tokenizer-init to give prompts as token ids")
    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds, with long texts
        raise ValueError(f"cannot load the tokenizer of {directory}: {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


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
