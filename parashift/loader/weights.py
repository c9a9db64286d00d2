"""Put checkpoint tensors into a model's (possibly packed, sharded) parameters."""
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from parashift.layers.missing import MissingLayer
from parashift.lazy_tensor import LazySlice, as_tensor
from parashift.loader.source import ModelSource

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
HF_FP8_SCALE = ".weight_scale_inv"
# an FP8 KV cache's scales as checkpoints name them -> the attention layer's parameters
KV_SCALE_NAMES = {"self_attn.k_scale": "self_attn.attn.k_scale",
                  "self_attn.v_scale": "self_attn.attn.v_scale",
                  "self_attn.k_proj.output_scale": "self_attn.attn.k_scale",
                  "self_attn.v_proj.output_scale": "self_attn.attn.v_scale"}
KV_SCALES = tuple(KV_SCALE_NAMES)
# one expert's matrix ("<module>.experts.<id>.<leaf>.weight") or all experts' stacked (GGUF)
# (or its FP8 scale, loaded into the stacked parameter's "<param>_scale")
EXPERT_NAME = re.compile(r"(?P<module>.+\.experts)\.(?:(?P<expert>[0-9]+)\.)?(?P<leaf>\w+)"
                         r"\.weight(?P<scale>_scale)?")


def checkpoint_names(model: nn.Module) -> list[str]:
    """The Hugging Face tensor names the model's parameters are loaded from."""
    packed_into: dict[str, list[str]] = {}
    for ckpt, (param, _) in model.packed_modules_mapping.items():
        packed_into.setdefault(param, []).append(ckpt)
    stacked_from = {}  # stacked expert parameter -> its checkpoint leaves (first name kept)
    for ckpt, target in model.expert_modules_mapping.items():
        stacked_from.setdefault(target, ckpt)
    names = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if _optional(param):  # made at load (FP8 scales), or defaulted (KV scales)
            continue
        module, _, suffix = name.rpartition(".")
        if module.endswith(".experts"):  # all experts stacked, by their HF leaf names
            names += [f"{module}.{ckpt}.weight" for (param, _), ckpt in stacked_from.items()
                      if param == suffix]
            continue
        parent, _, leaf = module.rpartition(".")
        for ckpt_leaf in packed_into.get(leaf, [leaf]):
            names.append(".".join(part for part in (parent, ckpt_leaf, suffix) if part))
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in names:
        names.append("model.embed_tokens.weight")  # a tied LM head loads from the embedding
    return list(dict.fromkeys(names))


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                 params: dict | None = None) -> None:
    """`params`: what to load into, by parameter name (default the model's parameters;
    loader/weight_pieces.py passes probes that record where each tensor goes)."""
    params = dict(model.named_parameters()) if params is None else params
    tied = getattr(model.config, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES):
            continue
        target, shard_id = _target_of(model, name)
        if tied and name == "model.embed_tokens.weight" and "lm_head.weight" in params:
            _load(params["lm_head.weight"], tensor, None)  # last stage without the embedding
            loaded.add("lm_head.weight")
        if target not in params:
            if _lands_on_missing_layer(model, target) or (tied and name == "lm_head.weight") \
                    or name.endswith(KV_SCALES):  # an FP8 KV cache's, unused by this pool
                continue
            raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")
        _load(params[target], tensor, shard_id)
        loaded.add(target)
    missing = {name for name in set(params) - loaded
               if not _optional(params[name])}
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    unfilled = [name for name, p in params.items() if getattr(p, "nan_until_loaded", False)
                and isinstance(p, torch.Tensor) and p.device.type != "meta" and p.isnan().any()]
    if unfilled:
        raise ValueError(f"checkpoint lacks scales of part of {unfilled[:3]} (e.g. the q, k or v "
                         "part of a packed matrix)")


def _optional(param) -> bool:
    return getattr(param, "filled_by_weight", False) or getattr(param, "checkpoint_optional", False)


def _lands_on_missing_layer(model: nn.Module, name: str) -> bool:
    module = model
    for part in name.split(".")[:-1]:
        module = getattr(module, part, None) if not part.isdigit() else \
            (module[int(part)] if isinstance(module, nn.ModuleList) else None)
        if module is None:
            return False
        if isinstance(module, MissingLayer):
            return True
    return False


def _load(param: nn.Parameter, tensor, shard_id) -> None:
    if shard_id is not None:
        param.weight_loader(param, tensor, shard_id)
    else:
        _load_plain(param, tensor)


def _target_of(model: nn.Module, name: str) -> tuple[str, object]:
    if name.endswith(HF_FP8_SCALE):  # HF fp8's name of the weight's dequantizing scale
        name = name.removesuffix("_inv")
    for spelled, ours in KV_SCALE_NAMES.items():  # an FP8 KV cache's scales
        if name.endswith(spelled):
            return name.removesuffix(spelled) + ours, None
    for spelled, ours in model.checkpoint_renames.items():
        name = name.replace(spelled, ours)
    expert = EXPERT_NAME.fullmatch(name)
    if expert and expert["leaf"] in model.expert_modules_mapping:
        param, half = model.expert_modules_mapping[expert["leaf"]]
        index = int(expert["expert"]) if expert["expert"] is not None else None
        return f"{expert['module']}.{param}{expert['scale'] or ''}", (index, half)
    module, _, suffix = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf in model.packed_modules_mapping:
        packed, shard_id = model.packed_modules_mapping[leaf]
        return f"{parent}.{packed}.{suffix}", shard_id
    return name, None


def _load_plain(param: nn.Parameter, tensor) -> None:
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(param, tensor)
        return
    tensor = as_tensor(tensor)
    if param.shape != tensor.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(tensor.shape)}")
    else:
        param.data.copy_(tensor)


SAFETENSORS_INDEX = "model.safetensors.index.json"


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's shards: those its index names (all of which must exist),
    else every *.safetensors file in the directory."""
    index = directory / SAFETENSORS_INDEX
    if not index.exists():
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {directory}")
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the checkpoint index {index}: {e!r}") from None
    files = [directory / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"{index} names shards that are not in {directory}: {missing}")
    return files


def iterate_safetensors(directory: Path) -> Iterator[tuple[str, LazySlice]]:
    from safetensors import safe_open
    for file in safetensors_files(directory):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_slice(name)
                    yield name, LazySlice(tensor, tuple(tensor.get_shape()))
        except Exception as e:
            raise ValueError(f"cannot read weights from {file} (truncated or corrupt?): {e}") \
                from None


def init_random_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights at real shapes, for speed work (never for quality). An FP8 weight is
    drawn in fp32 and quantized by rows, its scales (`<name>_scale` or `weight_scale`)
    written with it. The draws come from generators seeded here, one per device, so a
    process draws the same weights whatever it ran before (a replacement worker draws its
    replica's weights)."""
    generators: dict[torch.device, torch.Generator] = {}

    def generator(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        return generators[device]

    params = dict(model.named_parameters())
    scales = {name: _scale_of(params, name) for name, param in params.items()
              if param.dtype == torch.float8_e4m3fn}
    written_with_weights = {id(scale) for scale in scales.values()}
    for name, param in params.items():
        if id(param) in written_with_weights or param.is_meta:  # meta: nothing to draw into
            continue
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif name in scales:
            _random_fp8(param, scales[name], generator(param.device))
        else:
            param.data.normal_(0.0, 0.02, generator=generator(param.device))


def _scale_of(params: dict, name: str) -> nn.Parameter:
    for candidate in (name + "_scale", name.removesuffix("weight") + "weight_scale"):
        if candidate in params:
            return params[candidate]
    raise ValueError(f"FP8 weight {name} has no scale parameter")


def _random_fp8(param: nn.Parameter, scale: nn.Parameter, gen: torch.Generator) -> None:
    from parashift.quantization.fp8 import quantize_rows
    for i in range(param.shape[0]) if param.dim() == 3 else [None]:  # stacked experts by one
        rows = torch.empty(param.shape[-2:], device=param.device)
        rows.normal_(0.0, 0.02, generator=gen)
        q, row_scales = quantize_rows(rows)
        target, target_scale = (param.data, scale.data) if i is None else (param.data[i],
                                                                          scale.data[i])
        target.copy_(q)
        target_scale.copy_(row_scales.reshape(target_scale.shape))


def load_model_weights(model: nn.Module, source: ModelSource, seed: int = 0) -> None:
    if source.kind == "random":
        init_random_weights(model, seed)
    elif source.kind == "gguf":
        from parashift.loader.gguf_loader import iterate_gguf_weights
        load_weights(model, iterate_gguf_weights(source.path, model.config, checkpoint_names(model)))
    else:
        load_weights(model, iterate_safetensors(source.path))
