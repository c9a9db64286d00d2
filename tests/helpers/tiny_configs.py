"""Tiny random Hugging Face checkpoints of each supported family, for parity tests.

Weights are drawn wide (norm gains near 1, biases non-zero) so that every
parameter matters and greedy choices are not decided by float noise."""
from pathlib import Path

import torch

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5)


def _llama(**overrides):
    from transformers import LlamaConfig
    return LlamaConfig(**{**TINY, "tie_word_embeddings": False, **overrides})


def _llama31():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return _llama(**_rope_kwargs(rope))


def _mistral():
    from transformers import MistralConfig
    return MistralConfig(**{**TINY, "num_hidden_layers": 3, "sliding_window": None,
                            "tie_word_embeddings": False})


def _qwen2():
    from transformers import Qwen2Config
    return Qwen2Config(**{**TINY, "num_key_value_heads": 1, "tie_word_embeddings": False,
                          "use_sliding_window": False})


def _qwen3():
    from transformers import Qwen3Config
    return Qwen3Config(**{**TINY, "head_dim": 32, "num_hidden_layers": 3,
                          "tie_word_embeddings": True, "use_sliding_window": False})


def _smollm2_like():
    return _llama(num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=4,
                  tie_word_embeddings=True, **_rope_kwargs({"rope_type": "default",
                                                             "rope_theta": 100000.0}))


def _qwen3_moe(**overrides):
    """Eight experts, two per token; layer 1 dense (mlp_only_layers)."""
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(**{**TINY, "head_dim": 16, "num_hidden_layers": 3, "num_experts": 8,
                             "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                             "norm_topk_prob": True, "mlp_only_layers": [1],
                             "tie_word_embeddings": False, "use_sliding_window": False,
                             **overrides})


def _mixtral():
    from transformers import MixtralConfig
    return MixtralConfig(**{**TINY, "intermediate_size": 32, "num_local_experts": 4,
                            "num_experts_per_tok": 2, "sliding_window": None,
                            "tie_word_embeddings": False})


def _rope_kwargs(rope: dict) -> dict:
    """transformers 5 takes `rope_parameters`; 4.x took `rope_scaling` and `rope_theta`."""
    import transformers
    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": rope}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": rope["rope_theta"],
            "rope_scaling": None if scaling["rope_type"] == "default" else scaling}


FAMILIES = {
    "llama-gqa-untied": _llama,
    "llama3.1-rope-scaling": _llama31,
    "mistral": _mistral,
    "qwen2-qkv-bias": _qwen2,
    "qwen3-qk-norm-head-dim": _qwen3,
    "smollm2-like-tied": _smollm2_like,
}


# mixtures of experts (every family builds on the Llama stack; these add the experts)
MOE_FAMILIES = {
    "qwen3-moe": _qwen3_moe,
    "qwen3-moe-unnormalized-topk": lambda: _qwen3_moe(norm_topk_prob=False, mlp_only_layers=[]),
    "mixtral": _mixtral,
}


def tiny_config(family: str):
    return {**FAMILIES, **MOE_FAMILIES}[family]()


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.15) -> None:
    """Every parameter random: matrices N(0, std), biases N(0, 0.1), norm gains 1 + N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(std * noise)


def tiny_hf_model(family: str, seed: int = 0):
    """The HF model of a tiny random checkpoint of `family`, in fp32 eval mode."""
    from transformers import AutoModelForCausalLM
    config = tiny_config(family)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    return model.eval()


def save_tiny_checkpoint(family: str, directory: Path, max_shard_size: str | None = None,
                         seed: int = 0):
    """Saves a tiny random checkpoint of `family` (safetensors, optionally sharded) into
    `directory`; returns the HF model."""
    model = tiny_hf_model(family, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model
