"""The Llama family decoder: Llama 2/3/3.x, Mistral, Qwen2/2.5 (QKV bias),
Qwen3 (per-head q/k RMSNorm), SmolLM2. Weight names follow Hugging Face."""
import torch
from torch import nn

from parashift.layers.activation import SiluAndMul
from parashift.layers.attention import Attention
from parashift.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from parashift.layers.dense_gated_silu import fuse_silu_into_dense_gate_up
from parashift.layers.fp8_gated_silu import fuse_silu_into_fp8_gate_up
from parashift.layers.fp8_input import hand_over_fp8_inputs
from parashift.layers.l2_prefetch import NO_PREFETCHES, attach_l2_prefetch
from parashift.layers.silu_gemv import fuse_silu_into_gemv
from parashift.layers.split_parts_norm import hand_over_split_parts
from parashift.layers.layernorm import RMSNorm, qk_norm
from parashift.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from parashift.layers.missing import MissingLayer
from parashift.layers.rotary import get_rotary_embedding
from parashift.context import ffn_sharding, get_context


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class LlamaAttention(nn.Module):
    def __init__(self, cfg, max_position: int):
        super().__init__()
        head_dim = head_dim_of(cfg)
        qkv_bias = cfg.model_type == "qwen2" or getattr(cfg, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * head_dim, cfg.hidden_size,
                                        bias=getattr(cfg, "attention_bias", False))
        heads, kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.attn = Attention(heads, kv_heads, head_dim, scale=head_dim ** -0.5,
                              rotary_emb=get_rotary_embedding(cfg, head_dim, max_position),
                              kv_head_start=self.qkv_proj.kv_head_start(),
                              total_kv_heads=cfg.num_key_value_heads)
        self.l2_prefetch = NO_PREFETCHES  # after each GEMM (layers/l2_prefetch.py)
        if cfg.model_type in ("qwen3", "qwen3_moe"):
            self.q_norm = RMSNorm(head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, cfg.rms_norm_eps)
            self.norms_in_attn = self.attn.take_qk_norms(self.q_norm, self.k_norm)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        blocks, widths = self.qkv_proj.output_split()
        qkv = self.qkv_proj(x)
        self.l2_prefetch.after("qkv", qkv)
        if blocks == 1:  # split on the heads: three views in two dispatches
            q, k, v = qkv.unflatten(-1, (-1, self.head_dim)).split(
                [width // self.head_dim for width in widths], dim=-2)
        else:  # rows reordered per SP rank, [q_0 k_0 v_0 | q_1 k_1 v_1 | ..]: back to [q | k | v]
            q, k, v = (t.flatten(-2).unflatten(-1, (-1, self.head_dim))
                       for t in qkv.unflatten(-1, (blocks, -1)).split(widths, -1))
        if self.q_norm is not None and not self.norms_in_attn:
            q, k = qk_norm(self.q_norm, self.k_norm, q, k)
        o = self.o_proj(self.attn(positions, q, k, v).flatten(-2))
        self.l2_prefetch.after("o", o)
        return o


class LlamaMLP(nn.Module):
    # (op, FP8 linear layer it feeds): the op may quantize its output (layers/fp8_input.py)
    fp8_input_pairs = (("act", "down_proj"),)
    # (gate_up, SiLU-and-mul, down): a GEMV may form the product (layers/silu_gemv.py)
    silu_gemv_triples = (("gate_up_proj", "act", "down_proj"),)

    def __init__(self, cfg):
        super().__init__()
        bias = getattr(cfg, "mlp_bias", False)
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2,
                                                       bias=bias)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.act = SiluAndMul()
        self.l2_prefetch = NO_PREFETCHES  # after each GEMM (layers/l2_prefetch.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks, _ = self.gate_up_proj.output_split()
        gate_up = self.gate_up_proj(x)
        self.l2_prefetch.after("gate_up", gate_up)
        down = self.down_proj(self.act(gate_up, blocks))
        self.l2_prefetch.after("down", down)
        return down


class LlamaDecoderLayer(nn.Module):
    fp8_input_pairs = (("input_layernorm", "self_attn.qkv_proj"),
                       ("post_attention_layernorm", "mlp.gate_up_proj"))
    # (RMSNorm, mixture of experts it feeds): the norm may route too (layers/norm_router.py)
    norm_router_pairs = (("post_attention_layernorm", "mlp"),)
    # (RMSNorm, linear layer feeding it): the norm may sum the layer's split-K parts
    # (layers/split_parts_norm.py)
    split_parts_norm_pairs = (("post_attention_layernorm", "self_attn.o_proj"),)
    # (short name, GEMM) in step order: weights pulled into L2 ahead (layers/l2_prefetch.py;
    # the block holding each GEMM calls its point after it)
    l2_prefetch_order = (("qkv", "self_attn.qkv_proj"), ("o", "self_attn.o_proj"),
                         ("gate_up", "mlp.gate_up_proj"), ("down", "mlp.down_proj"))

    def __init__(self, cfg, max_position: int, mlp: nn.Module):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, max_position)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, x, residual):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    """The decoder stack; under pipeline parallelism this rank builds only its
    stage's layers (the rest are placeholders), the embedding on the first stage
    and the final norm on the last."""

    def __init__(self, cfg, max_position: int, make_mlp):
        super().__init__()
        state = get_context().state
        self.stage = state.plan.stage_layers(cfg.num_hidden_layers, state.pp.rank)
        self.first, self.last = state.is_first_stage, state.is_last_stage
        self.embed_tokens = (VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
                             if self.first else MissingLayer())
        with ffn_sharding():
            mlps = {i: make_mlp(cfg, i) for i in self.stage}
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, max_position, mlps[i]) if i in self.stage else MissingLayer()
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if self.last else MissingLayer()

    @property
    def split_parts_norm_pairs(self) -> tuple[tuple[str, str], ...]:
        """(RMSNorm, linear layer feeding it) across decoder layers: each down projection and
        the norm its output reaches next (the next layer's input norm, the final norm), where
        both are on this stage (layers/split_parts_norm.py)."""
        layers = list(self.stage)
        after = [f"layers.{i}.input_layernorm" for i in layers[1:]] + (["norm"] if self.last else [])
        return tuple((norm, f"layers.{i}.mlp.down_proj") for i, norm in zip(layers, after))

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor,
                intermediate: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Returns the final hidden states on the last stage, else (x, residual)."""
        if self.first:
            x, residual = self.embed_tokens(token_ids), None
        else:
            x, residual = intermediate
        for i in self.stage:
            x, residual = self.layers[i](positions, x, residual)
        if not self.last:
            return x, residual
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    # checkpoint name -> (parameter name, shard id) for matrices stored packed here
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    # checkpoint name of one expert's matrix -> (stacked parameter, half: 0 gate, 1 up, None)
    expert_modules_mapping: dict[str, tuple[str, int | None]] = {}
    # parts of checkpoint names spelled differently here
    checkpoint_renames: dict[str, str] = {}

    def __init__(self, cfg, max_position: int):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, max_position, self.make_mlp)
        self.lm_head = (ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
                        if self.model.last else MissingLayer())
        if getattr(cfg, "tie_word_embeddings", False) and self.model.first and self.model.last:
            self.lm_head.weight = self.model.embed_tokens.weight
        hand_over_fp8_inputs(self)
        fuse_silu_into_gemv(self)
        fuse_silu_into_dense_gate_up(self)
        fuse_silu_into_fp8_gate_up(self)
        hand_over_split_parts(self)
        attach_l2_prefetch(self)

    @staticmethod
    def make_mlp(cfg, layer_index: int) -> nn.Module:
        return LlamaMLP(cfg)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, intermediate=None):
        return self.model(token_ids, positions, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
