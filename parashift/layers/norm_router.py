"""The post-attention residual add + RMSNorm of a mixture-of-experts layer and its router in
one launch at one row (decode at batch 1; the kernel: kernels/moe_norm_router.py).

A model names its (RMSNorm, FusedMoE it feeds) pairs by attribute path (`norm_router_pairs`
on a module class); `fuse_norm_into_router` replaces each such norm by `NormRouter`. Unless
PARASHIFT_MOE_NORM_ROUTER=0 (read at each call: a CUDA graph keeps what its capture read),
where the kernel takes the row, the twin normalises the row and routes it in one launch,
returns the norm's outputs and hands the routing to the FusedMoE, which takes it for that
very tensor instead of running its router (the decoder layer calls the norm and then the
MLP, nothing in between). Else the twin is the norm it replaced. Never in deterministic mode
(the router's batch-invariant GEMM)."""
import torch

from parashift.kernels import use_triton
from parashift.layers.fused_moe import FusedMoE
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.layernorm import RMSNorm


class NormRouter(RMSNorm):
    """An RMSNorm that also routes its row for the FusedMoE after it, where switched on."""

    def __init__(self, norm: RMSNorm, moe: FusedMoE):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self._plain = norm.forward  # methods: no submodule
        self._router = moe.fused_router
        self._hold = moe.hold_routing

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None and use_triton(x):
            from parashift.kernels import moe_norm_router
            router = self._router()
            if (router is not None and moe_norm_router.enabled()
                    and moe_norm_router.fits(x, residual, self.weight, router[0], router[1])):
                out, new_x, weights, ids = moe_norm_router.norm_router(
                    x, residual, self.weight, self.eps, *router)
                self._hold(out, weights, ids)
                return out, new_x
        return self._plain(x, residual)


def fuse_norm_into_router(model: torch.nn.Module) -> int:
    """Replaces each RMSNorm of the model's `norm_router_pairs` that feeds a FusedMoE by its
    routing twin; returns how many were replaced."""
    replaced = 0
    for module, name, norm, consumer in declared_pairs(model, "norm_router_pairs"):
        if (isinstance(norm, RMSNorm) and isinstance(consumer, FusedMoE)
                and not isinstance(norm, NormRouter)):
            setattr(module, name, NormRouter(norm, consumer))
            replaced += 1
    return replaced
