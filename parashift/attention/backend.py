"""One interface for attention over the paged KV pool.

KV pool, per layer: k_cache and v_cache of shape
[num_blocks, block_size, num_kv_heads, head_dim]. A backend first writes the
step's new k/v into their slots, then attends each query token to its
sequence's whole context (cached + new), causally."""
from typing import Protocol

import torch

from parashift.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None: ...

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        ...


def get_backend(name: str, device: torch.device, deterministic: bool = False) -> AttentionBackend:
    """`deterministic`: the batch-invariant variant (parashift/deterministic/). `auto` on
    CUDA: `cudnn` (the Triton kernels, long prompts through cuDNN) where cuDNN runs, else
    `triton`; `triton` alone in deterministic mode. `torch`: every sequence of a step in one
    call (torch_fast); `torch-ref`: the per-sequence reference (torch_ref)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "torch"
        if name == "triton" and not deterministic and _cudnn_available(device):
            name = "cudnn"
    if name == "torch-ref" and deterministic:
        raise ValueError("attention backend 'torch-ref' is not batch-invariant; deterministic "
                         "mode on the CPU needs 'torch' (or 'auto')")
    if name == "torch":
        if deterministic and device.type == "cuda":
            raise ValueError("deterministic mode on CUDA needs the triton attention backend "
                             "(the torch one is batch-invariant on the CPU only)")
        if deterministic:
            from parashift.attention.torch_invariant import InvariantTorchAttentionBackend
            return InvariantTorchAttentionBackend()
        from parashift.attention.torch_fast import FastTorchAttentionBackend
        return FastTorchAttentionBackend()
    if name == "torch-ref":
        from parashift.attention.torch_ref import TorchAttentionBackend
        return TorchAttentionBackend()
    if name == "triton":
        if device.type != "cuda":
            raise ValueError("attention backend 'triton' needs a CUDA device")
        from parashift.attention.triton_backend import TritonAttentionBackend
        return TritonAttentionBackend(batch_invariant=deterministic)
    if name == "cudnn":
        if deterministic:
            raise ValueError("attention backend 'cudnn' is not batch-invariant; deterministic "
                             "mode needs 'triton' (or 'auto')")
        if not _cudnn_available(device):
            raise ValueError("attention backend 'cudnn' needs a CUDA device of compute "
                             "capability 8.0 or more with cuDNN")
        from parashift.attention.cudnn_prefill import CudnnPrefillAttentionBackend
        return CudnnPrefillAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose auto, torch, torch-ref, triton or cudnn")


def _cudnn_available(device: torch.device) -> bool:
    from parashift.attention.cudnn_prefill import cudnn_attention_available
    return cudnn_attention_available(device)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
