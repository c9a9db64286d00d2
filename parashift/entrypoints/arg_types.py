"""Flag values in vLLM's spellings."""
import argparse


def human_int(text: str) -> int:
    """vLLM's sizes: 4096, 32k (thousands), 32K (1024s), 1m / 1M likewise."""
    units = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "K": 1024, "M": 1024 ** 2,
             "G": 1024 ** 3}
    text = text.strip()
    if text and text[-1] in units:
        try:
            return int(float(text[:-1]) * units[text[-1]])
        except ValueError:
            pass
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r} (e.g. 4096 or "
                                         "32k)") from None


DTYPE_NAMES = {"half": "float16", "float": "float32", "bf16": "bfloat16"}


def vllm_dtype(text: str) -> str:
    """--dtype in vLLM's spellings too (half, float)."""
    return DTYPE_NAMES.get(text, text)


def model_len(text: str) -> int | None:
    """--max-model-len as vLLM takes it: a size (32k), or auto / -1 for the model's own."""
    return None if text.strip().lower() in ("auto", "-1") else human_int(text)
