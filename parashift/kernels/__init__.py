"""Fused Triton kernels for the decode fast path. The layers call them on CUDA
tensors when Triton imports; their torch code stays the CPU path and the
reference the kernels round like."""
import functools

import torch


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and _triton_available()


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
