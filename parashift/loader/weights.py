"""Put checkpoint tensors into a model's (possibly packed, sharded) parameters."""
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from parashift.loader.source import ModelSource

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_names(model: nn.Module) -> list[str]:
    """The Hugging Face tensor names the model's parameters are loaded from."""
    packed_into: dict[str, list[str]] = {}
    for ckpt, (param, _) in model.packed_modules_mapping.items():
        packed_into.setdefault(param, []).append(ckpt)
    names = []
    for name, _ in model.named_parameters(remove_duplicate=False):
        module, _, suffix = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        for ckpt_leaf in packed_into.get(leaf, [leaf]):
            names.append(f"{parent}.{ckpt_leaf}.{suffix}")
    return names


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES):
            continue
        target, shard_id = _target_of(model, name)
        if target not in params:
            if name == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False):
                continue
            raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")
        param = params[target]
        param.weight_loader(param, tensor.to(param.dtype), shard_id) \
            if shard_id is not None else _load_plain(param, tensor)
        loaded.add(target)
    missing = set(params) - loaded
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def _target_of(model: nn.Module, name: str) -> tuple[str, object]:
    module, _, suffix = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf in model.packed_modules_mapping:
        packed, shard_id = model.packed_modules_mapping[leaf]
        return f"{parent}.{packed}.{suffix}", shard_id
    return name, None


def _load_plain(param: nn.Parameter, tensor: torch.Tensor) -> None:
    loader = getattr(param, "weight_loader", None)
    tensor = tensor.to(param.dtype)
    if loader is not None:
        loader(param, tensor)
    elif param.shape != tensor.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(tensor.shape)}")
    else:
        param.data.copy_(tensor)


def iterate_safetensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except Exception as e:
            raise ValueError(f"cannot read weights from {file.name}: {e}") from None


def init_random_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights at real shapes, for speed work (never for quality)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif param.device.type == "cpu":
            param.data.normal_(0.0, 0.02, generator=gen)
        else:
            param.data.normal_(0.0, 0.02)


def load_model_weights(model: nn.Module, source: ModelSource, seed: int = 0) -> None:
    if source.kind == "random":
        init_random_weights(model, seed)
    elif source.kind == "gguf":
        from parashift.loader.gguf_loader import iterate_gguf_weights
        load_weights(model, iterate_gguf_weights(source.path, model.config, checkpoint_names(model)))
    else:
        load_weights(model, iterate_safetensors(source.path))
