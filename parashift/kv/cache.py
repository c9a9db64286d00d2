"""The physical KV block pool of this rank: one K and one V tensor per layer of
shape [num_blocks, block_size, num_kv_heads, head_dim], allocated once."""
import logging
import math

import torch

from parashift.layers.attention import Attention

logger = logging.getLogger(__name__)
DEFAULT_CPU_KV_BYTES = 1 << 30


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # No kernel reads a slot before it is written (past a sequence's length they mask
        # or slice). On the CPU the pool is left untouched, so only the pages of blocks in
        # use are ever faulted in: zeroing 1 GiB took a rank's start-up about a second
        self.k = _pool(shape, dtype, device)
        self.v = _pool(shape, dtype, device)
        self.num_blocks, self.block_size = num_blocks, block_size

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def bind(self, model: torch.nn.Module) -> None:
        for i, layer in enumerate(attention_layers(model)):
            layer.k_cache, layer.v_cache = self.k[i], self.v[i]

    @classmethod
    def for_model(cls, model, config, device: torch.device, dtype: torch.dtype,
                  profile_peak_bytes, max_model_len: int, sp_size: int = 1,
                  agree_num_blocks=None) -> "KVCache":
        """Sized by config, or from free memory; `agree_num_blocks` makes all ranks
        settle on one count (the minimum)."""
        layers = attention_layers(model)
        kv_heads = layers[0].kv_heads_per_rank(sp_size)
        shape = (len(layers), config.block_size, kv_heads, layers[0].head_dim)
        block_bytes = 2 * math.prod(shape) * dtype.itemsize
        num_blocks = config.num_blocks
        if num_blocks is None and config.kv_cache_memory is not None:
            num_blocks = config.kv_cache_memory // block_bytes
        if num_blocks is None and device.type == "cpu":
            num_blocks = DEFAULT_CPU_KV_BYTES // block_bytes
        if num_blocks is None:
            num_blocks = _blocks_from_free_memory(cls, shape, dtype, device, config, block_bytes,
                                                  profile_peak_bytes)
        if agree_num_blocks is not None:
            num_blocks = agree_num_blocks(num_blocks)
        if num_blocks < 1:
            raise ValueError(f"no memory left for the KV cache (one block takes {block_bytes} bytes)")
        num_layers, block_size, kv_heads, head_dim = shape
        cache = cls(num_layers, num_blocks, block_size, kv_heads, head_dim, dtype, device)
        logger.info("KV cache: %d blocks of %d tokens, %.2f GiB", num_blocks, block_size,
                    cache.nbytes / 2**30)
        return cache


def _pool(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    allocate = torch.empty if device.type == "cpu" else torch.zeros
    return allocate(shape, dtype=dtype, device=device)


def _blocks_from_free_memory(cls, shape, dtype, device, config, block_bytes,
                             profile_peak_bytes) -> int:
    """`profile_peak_bytes(make_scratch)` runs a profiling step on a scratch pool of the
    size it asks `make_scratch(num_blocks)` for, and returns its memory peak. The scratch
    pool stands in for blocks of the real pool, so its bytes are not activations."""
    num_layers, block_size, kv_heads, head_dim = shape
    scratch_blocks = 0

    def make_scratch(num_blocks: int) -> "KVCache":
        nonlocal scratch_blocks
        scratch_blocks += num_blocks
        return cls(num_layers, num_blocks, block_size, kv_heads, head_dim, dtype, device)

    peak = profile_peak_bytes(make_scratch) - scratch_blocks * block_bytes
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = total * config.gpu_memory_utilization - (total - free) - peak
    logger.info("memory profile: activation peak %.2f GiB (beside a scratch KV pool of %.2f "
                "GiB), free %.2f GiB of %.2f GiB", peak / 2**30,
                scratch_blocks * block_bytes / 2**30, free / 2**30, total / 2**30)
    if budget < block_bytes:
        gib = 2**30
        raise ValueError(
            f"no memory left for the KV cache on {device}: {config.gpu_memory_utilization} of "
            f"its {total / gib:.1f} GiB is {total * config.gpu_memory_utilization / gib:.1f} "
            f"GiB, and the weights and everything else already use {(total - free) / gib:.1f} "
            f"GiB, activations {peak / gib:.2f} GiB more (one KV block takes {block_bytes} "
            "bytes). Split the weights over more ranks (a plan with more tensor or pipeline "
            "parallelism: sequence and data parallelism hold every weight on each rank) or "
            "raise --gpu-memory-utilization")
    return int(budget // block_bytes)


def attention_layers(model: torch.nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]
