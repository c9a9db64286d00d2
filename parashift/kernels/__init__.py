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


def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors (an H100's or H200's 132 for the Triton
    interpreter on the CPU, in tests)."""
    if device.type != "cuda":
        return 132
    return _cuda_num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
