import torch
import torch.nn.functional as F
from torch import nn

from parashift.kernels import use_triton
from parashift.layers.rotary import heads_side_by_side


class RMSNorm(nn.Module):
    """RMSNorm; with `residual`, adds it first and returns (normed, new residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if use_triton(x):
            from parashift.kernels import rmsnorm
            if residual is None:
                return rmsnorm.rms_norm(x, self.weight, self.eps)
            return rmsnorm.add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return rms_norm_torch(x, self.weight, self.eps)
        return add_rms_norm_torch(x, residual, self.weight, self.eps)


def qk_norm(q_norm: RMSNorm, k_norm: RMSNorm, q: torch.Tensor, k: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_norm(q), k_norm(k)) of q [tokens, q heads, d] and k [tokens, k heads, d]; on CUDA in
    one launch (the same bits) where k's heads follow q's in memory row by row (the QKV
    projection's output, split)."""
    both = heads_side_by_side(q, k) if use_triton(q) and q_norm.eps == k_norm.eps else None
    if both is None or q_norm.weight.dtype != k_norm.weight.dtype:
        return q_norm(q), k_norm(k)
    from parashift.kernels import rmsnorm
    items = rmsnorm.HEADS_ITEMS if both.shape[0] * both.shape[1] >= rmsnorm.MANY_HEAD_ROWS else 1
    out = rmsnorm.rms_norm_heads(both, q_norm.weight, q_norm.eps, items, k_norm.weight,
                                 q.shape[1])
    return out[:, :q.shape[1]], out[:, q.shape[1]:]


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The CPU path and the kernels' reference (HF's arithmetic: in fp32 the fused op rounds
    the same, in bf16 the normalized rows are rounded before the weight's product; the
    fused op without a weight normalizes as HF's x * rsqrt(mean(x^2) + eps), in fewer
    dispatches)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def add_rms_norm_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = x + residual
    return rms_norm_torch(x, weight, eps), x
