"""A Hugging Face directory of random weights at a shape file's sizes, for runs that need a
real checkpoint (a safetensors slice per plan: determinism across plans, Seesaw's peer
re-shard) where the engine's own random init draws each plan's shards apart."""
import os

import torch


def random_checkpoint(shape: str, root: str, dtype: str) -> str:
    """An HF directory of random weights at `shape` (normal(0, 0.02), norms 1; each tensor
    drawn from a generator seeded by its index), written once and reused."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    directory = os.path.join(root, f"{os.path.basename(shape).removesuffix('.json')}-{dtype}")
    if os.path.exists(os.path.join(directory, "config.json")):
        return directory
    config = AutoConfig.from_pretrained(shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = [(name, param.shape) for name, param in model.named_parameters()]
    os.makedirs(directory, exist_ok=True)
    shard, shard_bytes, index = {}, 0, 0
    for i, (name, size) in enumerate(names):
        gen = torch.Generator().manual_seed(i)
        tensor = (torch.ones(size) if name.endswith("norm.weight")
                  else torch.randn(size, generator=gen) * 0.02).to(getattr(torch, dtype))
        shard[name], shard_bytes = tensor, shard_bytes + tensor.nbytes
        if shard_bytes > 2 << 30 or i == len(names) - 1:
            save_file(shard, os.path.join(directory, f"model-{index:05d}.safetensors"),
                      metadata={"format": "pt"})
            shard, shard_bytes, index = {}, 0, index + 1
    config.save_pretrained(directory)  # last: its presence marks a complete checkpoint
    return directory
