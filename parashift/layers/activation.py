import torch
import torch.nn.functional as F
from torch import nn

from parashift.context import get_context
from parashift.deterministic import elementwise
from parashift.kernels import use_triton


class SiluAndMul(nn.Module):
    """silu(gate) * up for a tensor holding [gate | up] on its last dim, or `blocks` such
    blocks [gate_0 up_0 | gate_1 up_1 | ...] (a layer whose rows were reordered, see
    parashift/parallel/shift_weights.py); the result is [out_0 | out_1 | ...]."""

    def __init__(self):
        super().__init__()
        self.torch_fn = (elementwise.silu_and_mul if get_context().reduction_chunks
                         else silu_and_mul_torch)

    def forward(self, x: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        if blocks > 1:  # the same kernel over [.., blocks, 2 d]: a view, no copy
            return self.forward(x.unflatten(-1, (blocks, -1))).flatten(-2)
        if use_triton(x):
            from parashift.kernels import silu_mul
            return silu_mul.silu_and_mul(x)
        return self.torch_fn(x)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """The CPU path and the kernel's reference."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)  # the product in silu's buffer: one allocation fewer
