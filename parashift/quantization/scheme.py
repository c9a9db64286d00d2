"""Which weight quantization a model runs with: `--quantization` and the checkpoint's
`quantization_config` (config.json) together.

- none asked, none in the checkpoint: no quantization.
- `fp8` asked of a bf16/fp16/fp32 checkpoint: its linear layers' weights are quantized at
  load (vLLM's "fp8" method: E4M3, one scale per output channel; activations per token).
- a checkpoint in FP8 (detected, asked or not) loads as it is: compressed-tensors
  (llm-compressor's `*-FP8-dynamic` / `*-FP8`: `weight` E4M3 + `weight_scale` per channel or
  per tensor, `input_scale` for static activations) or HF's `quant_method: fp8`
  (`weight_scale_inv`, per channel or per tensor; block-wise scales are refused).
- any other scheme is an error naming it."""
from dataclasses import dataclass

from parashift.quantization import check_quantization

# compressed-tensors' `ignore` entries that name layers kept unquantized anyway here
_UNQUANTIZED_MODULES = ("lm_head", "re:.*lm_head", "re:.*mlp.gate$", "re:.*mlp\\.gate$")


@dataclass(frozen=True)
class WeightQuant:
    """`serialized`: the checkpoint holds E4M3 weights and their scales; `scale_name`: the
    checkpoint's name of a weight's scale; `static_activations`: it holds `input_scale`."""
    method: str = "fp8"
    serialized: bool = False
    scale_name: str = "weight_scale"
    static_activations: bool = False


def weight_quant(quantization: str | None, hf_config) -> WeightQuant | None:
    """The scheme to run, or None; a clear ValueError for what is not supported."""
    check_quantization(quantization)
    qconfig = getattr(hf_config, "quantization_config", None)
    if qconfig is None:
        return WeightQuant() if quantization == "fp8" else None
    if not isinstance(qconfig, dict):
        qconfig = qconfig.to_dict() if hasattr(qconfig, "to_dict") else vars(qconfig)
    method = qconfig.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(qconfig)
    if method == "fp8":
        return _hf_fp8(qconfig)
    raise ValueError(f"the checkpoint is quantized with {method!r} (its config.json's "
                     "quantization_config), which is not supported; supported: fp8 "
                     "(compressed-tensors float8, or quant_method 'fp8'), or a bf16/fp16 "
                     "checkpoint with quantization='fp8'")


def _hf_fp8(qconfig: dict) -> WeightQuant:
    if qconfig.get("weight_block_size"):
        raise ValueError(f"block-wise fp8 not supported (the checkpoint's weight_block_size is "
                         f"{qconfig['weight_block_size']}); per-channel and per-tensor "
                         "scales are")
    scheme = qconfig.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"fp8 activation_scheme {scheme!r} is not supported: dynamic or static")
    return WeightQuant(serialized=True, scale_name="weight_scale_inv",
                       static_activations=scheme == "static")


def _compressed_tensors(qconfig: dict) -> WeightQuant:
    groups = qconfig.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors checkpoint without config_groups: cannot tell "
                         "its scheme")
    static = set()
    for name, group in groups.items():
        weights = group.get("weights") or {}
        kind = f"{weights.get('type')}{weights.get('num_bits')}"
        if kind != "float8":
            raise ValueError(f"compressed-tensors scheme of group {name!r} ({kind} weights, "
                             f"strategy {weights.get('strategy')!r}) is not supported; "
                             "supported: float8 weights (FP8 / FP8-dynamic)")
        if weights.get("strategy") not in ("channel", "tensor"):
            raise ValueError(f"block-wise fp8 not supported: compressed-tensors group {name!r} "
                             f"has weight strategy {weights.get('strategy')!r} (channel and "
                             "tensor are)")
        acts = group.get("input_activations")
        if acts and f"{acts.get('type')}{acts.get('num_bits')}" != "float8":
            raise ValueError(f"compressed-tensors group {name!r} quantizes activations as "
                             f"{acts.get('type')}{acts.get('num_bits')}: not supported")
        static.add(bool(acts) and not acts.get("dynamic", True))
    ignored = [m for m in qconfig.get("ignore") or [] if m not in _UNQUANTIZED_MODULES]
    if ignored:
        raise ValueError(f"compressed-tensors checkpoint leaves layers unquantized ({ignored[:3]}"
                         "): only lm_head (and MoE routers) may be")
    if len(static) > 1:
        raise ValueError("compressed-tensors groups mix static and dynamic activation scales")
    return WeightQuant(serialized=True, static_activations=static.pop())
