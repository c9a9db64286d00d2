"""Mixture-of-experts decoders on the Llama stack: Qwen3-MoE (Qwen3 attention with q/k
RMSNorm, top-k routing renormalized when norm_topk_prob) and Mixtral (Mistral attention,
top-k always renormalized). Each layer's MLP is a `FusedMoE`, or a dense MLP where the
config says so (Qwen3-MoE's mlp_only_layers, decoder_sparse_step)."""
from torch import nn

from parashift.layers.fused_moe import FusedMoE
from parashift.layers.norm_router import fuse_norm_into_router
from parashift.models.llama import LlamaForCausalLM, LlamaMLP
from parashift.parallel.plan import ExpertShape

EXPERT_MODEL_TYPES = ("qwen3_moe", "mixtral")


def expert_shape(cfg, moe_parallel: str = "tp") -> ExpertShape | None:
    """The config's expert sizes; None for a dense model."""
    if cfg.model_type == "qwen3_moe":
        return ExpertShape(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                           moe_parallel)
    if cfg.model_type == "mixtral":
        return ExpertShape(cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size,
                           moe_parallel)
    return None


def is_sparse_layer(cfg, layer_index: int) -> bool:
    """Whether this layer's MLP is a mixture of experts."""
    if cfg.model_type != "qwen3_moe":
        return True
    return (layer_index not in (getattr(cfg, "mlp_only_layers", None) or [])
            and cfg.num_experts > 0 and (layer_index + 1) % cfg.decoder_sparse_step == 0)


def dense_intermediate_size(cfg) -> int | None:
    """The width of the model's dense MLPs (None: it has none), for the plan check."""
    shape = expert_shape(cfg)
    if shape is None:
        return cfg.intermediate_size
    if all(is_sparse_layer(cfg, i) for i in range(cfg.num_hidden_layers)):
        return None
    return cfg.intermediate_size


def check_plan(plan, cfg, moe_parallel: str = "tp") -> None:
    """Start-up check that `plan` can split the model of `cfg` (heads, layers, MLP widths,
    experts); the message names valid degrees."""
    plan.check_model(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers,
                     dense_intermediate_size(cfg), expert_shape(cfg, moe_parallel))


class MoeForCausalLM(LlamaForCausalLM):
    """Qwen3MoeForCausalLM and MixtralForCausalLM."""
    expert_modules_mapping = {
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
        "down_proj": ("down_proj", None),
        "w1": ("gate_up_proj", 0),  # Mixtral's names
        "w3": ("gate_up_proj", 1),
        "w2": ("down_proj", None),
    }
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}  # Mixtral's

    def __init__(self, cfg, max_position: int):
        super().__init__(cfg, max_position)
        fuse_norm_into_router(self)

    @staticmethod
    def make_mlp(cfg, layer_index: int) -> nn.Module:
        if not is_sparse_layer(cfg, layer_index):
            return LlamaMLP(cfg)
        shape = expert_shape(cfg)
        renormalize = cfg.model_type == "mixtral" or cfg.norm_topk_prob
        return FusedMoE(cfg.hidden_size, shape.num_experts, shape.top_k,
                        shape.intermediate_size, renormalize)
