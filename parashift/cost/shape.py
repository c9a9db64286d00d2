"""A model's shape as the cost model needs it: the projections' sizes, the experts, the KV
bytes per token; read from a Hugging Face config (a dict, a config.json, a model folder, or
the name of a committed shape in benchmarks/shapes/)."""
import json
from dataclasses import dataclass, replace
from pathlib import Path

SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")  # as models/llama.py's attention


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int             # a dense layer's MLP width
    vocab: int
    num_experts: int = 0          # 0: dense
    top_k: int = 0
    expert_intermediate: int = 0
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    weight_dtype_bytes: int = 0   # the linear layers' weights (1: FP8); 0: dtype_bytes
    kv_dtype_bytes: int = 0       # the KV cache's (1: FP8); 0: dtype_bytes
    qk_norm: bool = False         # RMSNorm over each query and key head (Qwen3)

    def __post_init__(self):
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "vocab",
                  "dtype_bytes"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"model shape {f} must be an integer >= 1, got {getattr(self, f)!r}")
        if self.num_experts and not (0 < self.top_k <= self.num_experts
                                     and self.expert_intermediate > 0):
            raise ValueError(f"model shape {self.name}: experts need top_k and their width")

    def quantized(self, quantization: str | None = None, kv_cache_dtype: str = "auto"
                  ) -> "ModelShape":
        """This shape served with `--quantization` and `--kv-cache-dtype` (the engine's
        values): FP8 linear weights (embeddings, LM head and norms keep the model's dtype),
        an FP8 KV cache."""
        if quantization not in (None, "fp8"):
            raise ValueError(f"quantization {quantization!r}: the cost model knows fp8 or none")
        if kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3"):
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: choose auto, fp8 or fp8_e4m3")
        if quantization and self.moe:
            raise ValueError(f"{self.name}: MoE experts refuse FP8 weights (as the engine does)")
        return replace(self, weight_dtype_bytes=1 if quantization else self.weight_dtype_bytes,
                       kv_dtype_bytes=1 if kv_cache_dtype != "auto" else self.kv_dtype_bytes)

    @property
    def linear_bytes(self) -> int:
        return self.weight_dtype_bytes or self.dtype_bytes

    @property
    def kv_elem_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    @property
    def fp8_weights(self) -> bool:
        return self.linear_bytes == 1

    @classmethod
    def of_config(cls, cfg: dict, name: str = "model") -> "ModelShape":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        return cls(name, cfg["num_hidden_layers"], cfg["hidden_size"],
                   cfg["num_attention_heads"],
                   cfg.get("num_key_value_heads") or cfg["num_attention_heads"], head_dim,
                   cfg.get("intermediate_size", 0), cfg["vocab_size"], experts,
                   cfg.get("num_experts_per_tok", 0) if experts else 0,
                   cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size", 0)
                                                        if experts else 0),
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   qk_norm=cfg.get("model_type") in QK_NORM_MODEL_TYPES)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        return self.hidden * (2 * self.q_width + 2 * self.kv_width)

    @property
    def mlp_params(self) -> int:
        if self.moe:
            return 3 * self.hidden * self.expert_intermediate * self.num_experts
        return 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params

    @property
    def layer_bytes(self) -> int:
        return self.layer_params * self.linear_bytes

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        return self.num_layers * self.layer_bytes + self.embedding_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_width * self.kv_elem_bytes


def load_shape(model: str) -> ModelShape:
    """`model`: a committed shape's name (benchmarks/shapes/<name>.json), a config.json, or
    a model folder holding one."""
    path = Path(model)
    names = {SHAPES / f"{model}.json": model, path: path.name.removesuffix(".json"),
             path / "config.json": path.name}
    for candidate, name in names.items():
        if candidate.is_file():
            return ModelShape.of_config(json.loads(candidate.read_text()), name)
    known = ", ".join(sorted(p.stem for p in SHAPES.glob("*.json")))
    raise ValueError(f"unknown model {model!r}: not a shape in benchmarks/shapes ({known}), "
                     "a config.json, nor a folder with one")
