"""GGUF checkpoints: the config built from the header's metadata fields, tensors
dequantized with the `gguf` package and renamed to Hugging Face names. The
header is parsed once (gguf_file.read_gguf_header caches it)."""
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from parashift.loader.gguf_file import GGUFHeader, GGUFTensorReader, read_gguf_header

logger = logging.getLogger(__name__)

# GGUF general.architecture -> (HF model_type, HF architecture)
SUPPORTED_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}
# llama.cpp writes Mixtral as "llama" with experts
LLAMA_WITH_EXPERTS = ("mixtral", "MixtralForCausalLM")
# "<arch>.<key>" -> HF config attribute
ARCH_FIELDS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}
TOKEN_FIELDS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
}
# llama.cpp interleaves q/k rows for its RoPE only in these architectures
PERMUTED_QK_ARCHITECTURES = ("llama",)


def gguf_config(path: Path):
    """The transformers config of a GGUF checkpoint, from its metadata alone."""
    from transformers import CONFIG_MAPPING
    header = read_gguf_header(path)
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF file {path} holds architecture {arch!r}, which parashift does not "
                         f"support; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    model_type, hf_arch = SUPPORTED_ARCHITECTURES[arch]
    fields = _config_fields(header)
    if header.arch_field("expert_count"):
        if arch == "llama":
            model_type, hf_arch = LLAMA_WITH_EXPERTS
        fields.update(_expert_fields(header, model_type))
    config = CONFIG_MAPPING[model_type](**fields)
    config.architectures = [hf_arch]
    return config


def _config_fields(header: GGUFHeader) -> dict:
    fields = {hf: header.arch_field(key) for key, hf in ARCH_FIELDS.items()
              if header.arch_field(key) is not None}
    fields.update({hf: header.metadata[key] for key, hf in TOKEN_FIELDS.items()
                   if key in header.metadata})
    if "vocab_size" not in fields and "tokenizer.ggml.tokens" in header.metadata:
        fields["vocab_size"] = len(header.metadata["tokenizer.ggml.tokens"])
    head_dim = header.arch_field("attention.key_length") or header.arch_field("rope.dimension_count")
    if head_dim:
        fields["head_dim"] = head_dim
    fields["tie_word_embeddings"] = "output.weight" not in header.tensors
    scaling = _rope_scaling(header)
    if scaling:
        fields["rope_scaling"] = scaling  # with rope_theta, as transformers 4 and 5 both take it
    if "rope_freqs.weight" in header.tensors:
        logger.warning("%s stores RoPE frequency factors (rope_freqs.weight, e.g. Llama 3.1 "
                       "scaling); they are not applied", header.path.name)
    return fields


def _expert_fields(header: GGUFHeader, model_type: str) -> dict:
    """The expert count under the config's name; Qwen3-MoE's top-k renormalization, which
    llama.cpp applies unless the file says otherwise (Mixtral always renormalizes)."""
    count = header.arch_field("expert_count")
    if model_type == "mixtral":
        return {"num_local_experts": count}
    return {"num_experts": count,
            "norm_topk_prob": bool(header.arch_field("expert_weights_norm", True))}


def _rope_scaling(header: GGUFHeader) -> dict | None:
    rope_type = header.arch_field("rope.scaling.type")
    if rope_type in (None, "none"):
        return None
    scaling = {"rope_type": rope_type, "factor": header.arch_field("rope.scaling.factor", 1.0)}
    original = header.arch_field("rope.scaling.original_context_length")
    if original:
        scaling["original_max_position_embeddings"] = original
    return scaling


def _undo_rope_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp stores each head's q/k rows as interleaved pairs for its RoPE;
    Hugging Face keeps the two halves apart."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor_name_map(header: GGUFHeader, num_layers: int):
    import gguf
    arch = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}.get(header.architecture,
                                                                      gguf.MODEL_ARCH.LLAMA)
    return gguf.get_tensor_name_map(arch, num_layers)


def iterate_gguf_weights(path: Path, hf_config, checkpoint_names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every HF parameter name whose GGUF tensor exists."""
    header = read_gguf_header(path)
    name_map = _tensor_name_map(header, hf_config.num_hidden_layers)
    permuted = header.architecture in PERMUTED_QK_ARCHITECTURES
    with GGUFTensorReader(header) as reader:
        for hf_name in checkpoint_names:
            base, _, suffix = hf_name.rpartition(".")
            gguf_base = name_map.get_name(base)
            gguf_name = f"{gguf_base}.{suffix}" if gguf_base else None
            if gguf_name not in header.tensors:
                continue
            try:
                array = reader.read(gguf_name)
            except Exception as e:
                raise ValueError(f"cannot dequantize {gguf_name} in {path}: {e}") from None
            if permuted and base.endswith("q_proj"):
                array = _undo_rope_permute(array, hf_config.num_attention_heads)
            elif permuted and base.endswith("k_proj"):
                array = _undo_rope_permute(array, hf_config.num_key_value_heads)
            yield hf_name, _to_tensor(array)


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    if not array.flags.writeable:  # an F32 tensor viewed straight from the file's map
        array = array.copy()
    return torch.from_numpy(array.astype(np.float32, copy=False))
