import torch
import torch.nn.functional as F
from torch import nn

from parashift.kernels import use_triton


class SiluAndMul(nn.Module):
    """silu(gate) * up for a tensor holding [gate | up] on its last dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from parashift.kernels import silu_mul
            return silu_mul.silu_and_mul(x)
        return silu_and_mul_torch(x)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """The CPU path and the kernel's reference."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
