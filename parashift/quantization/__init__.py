"""Quantized weights and KV cache: the schemes the engine accepts (`quantization`,
`kv_cache_dtype`), what a checkpoint's `quantization_config` says (`scheme.py`), and the
FP8 arithmetic the layers call (`fp8.py`)."""

QUANTIZATIONS = ("fp8",)  # --quantization; None: the checkpoint's own, or none
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # --kv-cache-dtype; auto: the model's dtype


def check_quantization(quantization: str | None) -> None:
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported; supported: "
                         f"{list(QUANTIZATIONS)} (or None: the checkpoint's own scheme)")


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; supported: "
                         f"{list(KV_CACHE_DTYPES)}")


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype):
    """The KV pool's element type: E4M3 for fp8, else the model's."""
    import torch
    return torch.float8_e4m3fn if kv_cache_dtype in ("fp8", "fp8_e4m3") else model_dtype
