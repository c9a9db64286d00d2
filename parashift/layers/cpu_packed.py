"""GEMMs on the CPU through oneDNN with each weight reordered once, at start-up, into the
blocked layout its kernels read (what `F.linear` would pack again on every call).

On a one-device CPU engine the linear layers and the LM head swap their `matmul` for a
`PackedLinear` of their weight: a step's GEMMs then skip the per-call packing, which at
decode's few rows is a large share of a GEMM (measured in docs/benchmark_log.md). The
packed copy is a second copy of the weights, so it is made only where it fits in the
host's available memory. Any other weight (a narrowed layout, a dequantized copy) and
any non-CPU input take the plain GEMM."""
import logging

import torch
import torch.nn.functional as F
from torch import nn

from parashift.host_memory import mem_available_bytes

logger = logging.getLogger(__name__)

PACKED_DTYPES = (torch.float32, torch.bfloat16)
_LINEAR = torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else None


def can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_reorder_linear_weight")


class PackedLinear:
    """`matmul(x, weight, bias)` reading `source`'s packed copy when handed `source`
    itself, unchanged since it was packed; any other weight runs `fallback`."""

    def __init__(self, source: torch.Tensor, fallback):
        self.source, self.fallback = source, fallback
        self.stamp = _stamp(source)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(source.detach())

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        if weight is not self.source or x.dtype != weight.dtype or x.is_cuda \
                or _stamp(weight) != self.stamp:
            return self.fallback(x, weight, bias)
        if x.dim() == 2:
            return _LINEAR(x, self.packed, bias, "none", [], "")
        out = _LINEAR(x.reshape(-1, x.shape[-1]), self.packed, bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])


def _stamp(weight: torch.Tensor) -> tuple[int, int]:
    """Changes when the weight's storage is replaced or written in place through it (not
    through `.data`: weights are packed after loading, and a one-device engine writes none
    after that)."""
    return weight.data_ptr(), weight._version


def packable_layers(model: nn.Module) -> list[nn.Module]:
    """The modules with a plain float `weight` on the CPU whose GEMMs go through their
    `matmul` attribute (the linear layers and the LM head)."""
    return [m for m in model.modules()
            if hasattr(m, "matmul") and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.device.type == "cpu" and m.weight.dtype in PACKED_DTYPES
            and m.weight.dim() == 2 and getattr(m, "weight_scale", None) is None]


def pack_cpu_weights(model: nn.Module) -> int:
    """Gives the model's CPU GEMMs packed weights where they fit in half the host's
    available memory; returns the bytes the packed copies take (0: none made)."""
    if not can_pack():
        return 0
    layers = packable_layers(model)
    needed = sum({id(m.weight): m.weight.nbytes for m in layers}.values())
    available = mem_available_bytes()
    if available is not None and needed > available // 2:
        logger.info("CPU weights not packed: %.1f GiB would not fit in half of the %.1f GiB "
                    "available", needed / 2**30, available / 2**30)
        return 0
    for module in layers:
        module.matmul = PackedLinear(module.weight, F.linear)
    return needed


def unpack_cpu_weights(model: nn.Module) -> int:
    """Gives the packed layers their plain GEMM back (a before/after in one process);
    returns how many were packed."""
    layers = [m for m in model.modules() if isinstance(getattr(m, "matmul", None), PackedLinear)]
    for module in layers:
        module.matmul = module.matmul.fallback
    return len(layers)
