"""The CPU KV tier: one host buffer [layers, 2 (K, V), kv_heads, tokens, head_dim] for
every layer and KV head of the model, head-major (HND) so that the slice one rank of a
plan holds (its layers x its heads, kv/tier_copy.py) is a few contiguous runs per head.
The buffer is a file in /dev/shm mapped by the engine and every worker of the node
(`torch.from_file(..., shared=True)`), so the ranks of one plan write their slices of a
request and the ranks of another read theirs without a message. The slots (token ranges
per request) are accounted on the engine's side (kv/tier_allocator.py). The pool's bytes
are moved as they are: K after RoPE, in the pool's dtype. A worker that copies between
the tier and a GPU page-locks its mapping (`open(..., device)`), so the copies are DMA
transfers instead of staged copies from pageable memory."""
import logging
import os
import time
import uuid
import weakref
from dataclasses import dataclass

import torch

from parashift.host_memory import SHM_DIR, check_host_memory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of_model(cls, hf_config, dtype: torch.dtype) -> "TierShape":
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        return cls(hf_config.num_hidden_layers, hf_config.num_key_value_heads, head_dim, dtype)

    @property
    def token_bytes(self) -> int:
        """Bytes one token's K and V take over every layer and head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def tokens_for(self, cpu_kv_tokens: int | None, cpu_kv_gib: float | None) -> int:
        """The tier's capacity in tokens from --cpu-kv-tokens or --cpu-kv-gib."""
        if (cpu_kv_tokens is None) == (cpu_kv_gib is None):
            raise ValueError("size the CPU KV tier by one of cpu_kv_tokens or cpu_kv_gib")
        tokens = cpu_kv_tokens if cpu_kv_tokens is not None else int(
            cpu_kv_gib * 2**30 // self.token_bytes)
        if tokens < 1:
            raise ValueError(f"cpu_kv_gib = {cpu_kv_gib} holds no token ({self.token_bytes} "
                             "bytes each)")
        return tokens


class CpuKVTier:
    """The buffer, created by the engine (`create`) and opened by each worker (`open`)."""

    def __init__(self, path: str, shape: TierShape, tokens: int, owner: bool):
        self.path, self.shape, self.tokens, self.owner = path, shape, tokens, owner
        dims = (shape.num_layers, 2, shape.num_kv_heads, tokens, shape.head_dim)
        numel = dims[0] * dims[1] * dims[2] * dims[3] * dims[4]
        self.buffer = torch.from_file(path, shared=True, size=numel, dtype=shape.dtype).view(dims)
        self._unlock = None  # set by page_lock: unregisters the mapping, once

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @classmethod
    def create(cls, shape: TierShape, tokens: int, directory: str = SHM_DIR,
               advice: str = "; lower --cpu-kv-tokens or --cpu-kv-gib") -> "CpuKVTier":
        """A new zeroed buffer of `tokens` tokens; refuses when the host cannot hold it."""
        nbytes = tokens * shape.token_bytes
        check_host_memory({"CPU KV tier": nbytes}, shared=nbytes if directory == SHM_DIR else 0,
                          advice=advice)
        path = os.path.join(directory, f"parashift-kv-tier-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tier = cls(path, shape, tokens, owner=True)
        logger.info("CPU KV tier: %d tokens, %.2f GiB in %s", tokens, nbytes / 2**30, path)
        return tier

    @classmethod
    def open(cls, path: str, shape: TierShape, tokens: int,
             device: torch.device | None = None) -> "CpuKVTier":
        """Maps the engine's buffer; page-locks the mapping when `device` is a CUDA device."""
        tier = cls(path, shape, tokens, owner=False)
        if device is not None and device.type == "cuda":
            with torch.cuda.device(device):
                tier.page_lock()
        return tier

    @property
    def pinned(self) -> bool:
        return self._unlock is not None and self._unlock.alive

    def page_lock(self) -> None:
        """Registers the mapping with CUDA (cudaHostRegister), once; unregistered by close
        or when this object is collected, before the mapping goes."""
        if self.pinned:
            return
        start, ptr = time.perf_counter(), self.buffer.data_ptr()
        error = int(torch.cuda.cudart().cudaHostRegister(ptr, self.nbytes, 0))
        if error != 0:
            raise RuntimeError(
                f"cudaHostRegister of the CPU KV tier ({self.nbytes / 2**30:.2f} GiB in "
                f"{self.path}) failed with CUDA error {error}: the host cannot page-lock that "
                "much memory; lower --cpu-kv-tokens or --cpu-kv-gib, or free host memory")
        self._unlock = weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, ptr)
        logger.info("CPU KV tier page-locked: %.2f GiB in %.2f s", self.nbytes / 2**30,
                    time.perf_counter() - start)

    def close(self) -> None:
        """Drops this process's mapping (unregistered first where page-locked); the creator
        also removes the file."""
        if self._unlock is not None:
            self._unlock()
        self.buffer = None
        if self.owner and os.path.exists(self.path):
            os.unlink(self.path)


class TierMappings:
    """A worker's mappings of the engine's tiers, by path: each opened once, page-locked
    where the worker's device is a GPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self._tiers: dict[str, CpuKVTier] = {}

    def get(self, path: str, shape: TierShape, tokens: int) -> CpuKVTier:
        tier = self._tiers.get(path)
        if tier is None:
            tier = self._tiers[path] = CpuKVTier.open(path, shape, tokens, self.device)
        return tier

    def close(self) -> None:
        for tier in self._tiers.values():
            tier.close()
        self._tiers = {}
