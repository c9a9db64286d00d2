"""GGUF checkpoints: config and tokenizer through transformers, tensors read
and dequantized with the `gguf` package, renamed to Hugging Face names."""
from pathlib import Path
from typing import Iterator

import numpy as np
import torch


def _reader(path: Path):
    import gguf
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # truncated or corrupt file
        raise ValueError(f"cannot read GGUF file {path}: {e}") from None


def gguf_config(path: Path):
    from transformers import CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    try:
        raw = load_gguf_checkpoint(str(path))["config"]
    except Exception as e:
        raise ValueError(f"cannot read GGUF file {path}: {e}") from None
    model_type = raw.pop("model_type")
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(model_type)
    config = CONFIG_MAPPING[model_type](**raw)
    config.architectures = [arch] if arch else []
    return config


def _undo_rope_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp stores each head's q/k rows as interleaved pairs for its RoPE;
    Hugging Face keeps the two halves apart."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iterate_gguf_weights(path: Path, hf_config, checkpoint_names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every HF parameter name whose GGUF tensor exists."""
    import gguf
    reader = _reader(path)
    tensors = {t.name: t for t in reader.tensors}
    arch = gguf.MODEL_ARCH.QWEN3 if hf_config.model_type == "qwen3" else gguf.MODEL_ARCH.LLAMA
    name_map = gguf.get_tensor_name_map(arch, hf_config.num_hidden_layers)
    for hf_name in checkpoint_names:
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = name_map.get_name(base)
        tensor = tensors.get(f"{gguf_base}.{suffix}") if gguf_base else None
        if tensor is None:
            continue
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except Exception as e:
            raise ValueError(f"cannot dequantize {tensor.name} in {path}: {e}") from None
        if base.endswith("q_proj"):
            array = _undo_rope_permute(array, hf_config.num_attention_heads)
        elif base.endswith("k_proj"):
            array = _undo_rope_permute(array, hf_config.num_key_value_heads)
        yield hf_name, torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
