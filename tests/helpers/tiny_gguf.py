"""Tiny GGUF files written from a Hugging Face model, the way llama.cpp's converter
lays them out (q/k rows interleaved for Llama's RoPE), for loader parity tests."""
from pathlib import Path

import numpy as np
import torch

QUANTIZED = "Q8_0"  # matrices are stored quantized; norms and biases stay F32


def interleave_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Hugging Face q/k rows (two halves per head) -> llama.cpp's interleaved pairs."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _store(writer, name: str, w: np.ndarray, quantize: bool) -> np.ndarray:
    """Writes `w` and returns what a reader will get back (dequantized)."""
    import gguf
    if not quantize or w.ndim < 2:
        writer.add_tensor(name, w.astype(np.float32))
        return w.astype(np.float32)
    qtype = gguf.GGMLQuantizationType[QUANTIZED]
    q = gguf.quants.quantize(w.astype(np.float32), qtype)
    writer.add_tensor(name, q, raw_dtype=qtype)
    return gguf.quants.dequantize(q, qtype).reshape(w.shape)


def _add_metadata(writer, cfg, arch: str, with_vocab: bool) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(cfg))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    if with_vocab:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"<t{i}>" for i in range(cfg.vocab_size)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    _add_expert_metadata(writer, cfg)
    writer.add_array("parashift.test.floats", [0.5, -1.25])
    writer.add_bool("parashift.test.flag", True)


def _add_expert_metadata(writer, cfg) -> None:
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not experts:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if hasattr(cfg, "moe_intermediate_size"):
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        writer.add_expert_weights_norm(cfg.norm_topk_prob)


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def write_tiny_gguf(model, path: Path, arch: str, quantize: bool = True,
                    extra_metadata=None, with_vocab: bool = True) -> None:
    """Writes `model` (HF, fp32) as a GGUF of `arch` ("llama", "qwen2", "qwen3", "qwen3moe";
    Mixtral is "llama" with experts, as llama.cpp writes it) and sets
    the model's weights to what the file holds, so that the two compute the same.
    `extra_metadata(writer)` may add fields (a vocabulary, with with_vocab=False)."""
    import gguf
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    _add_metadata(writer, cfg, arch, with_vocab)
    if extra_metadata is not None:
        extra_metadata(writer)
    model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    tied = getattr(cfg, "tie_word_embeddings", False)
    with torch.no_grad():
        for hf_name, param in model.named_parameters():
            if tied and hf_name == "lm_head.weight":
                continue
            if hf_name.endswith("experts.gate_up_proj"):  # [gate | up] per expert: two tensors
                parts = [_store_param(writer, names, hf_name.replace("gate_up_proj", leaf),
                                      w.numpy(), cfg, arch, quantize)
                         for leaf, w in zip(("gate_proj.weight", "up_proj.weight"),
                                            param.chunk(2, dim=1))]
                param.copy_(torch.from_numpy(np.concatenate(parts, axis=1)))
                continue
            if hf_name.endswith("experts.down_proj"):
                hf_name += ".weight"
            stored = _store_param(writer, names, hf_name, param.numpy(), cfg, arch, quantize)
            param.copy_(torch.from_numpy(stored))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _store_param(writer, names, hf_name: str, w: np.ndarray, cfg, arch: str,
                 quantize: bool) -> np.ndarray:
    base, _, suffix = hf_name.rpartition(".")
    gguf_name = f"{names.get_name(base)}.{suffix}"
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(
        base.rpartition(".")[2])
    if arch != "llama" or heads is None:
        return _store(writer, gguf_name, w, quantize)
    stored = _store(writer, gguf_name, interleave_rope_rows(w, heads), quantize)
    return separate_rope_halves(stored, heads)


def separate_rope_halves(w: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of interleave_rope_rows."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_sentencepiece_vocab(writer) -> None:
    """A small llama.cpp "llama" (SentencePiece, byte fallback) vocabulary."""
    words = ["\u2581", "a", "b", "c", "h", "e", "l", "o", "t", "\u2581a", "\u2581b", "ab",
             "\u2581ab", "he", "ll", "th", "hell", "hello", "\u2581hello", "\u2581the"]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + words
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0] * (3 + 256) + [-float(i) for i in range(len(words))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(words))
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
