"""The RMSNorm after a mixture-of-experts layer (the next layer's input norm, or the model's
final norm) formed in the experts' down kernel at one row: its last program adds the
experts' output to the residual and normalises the row (kernels/moe_small.py's `norm`), one
launch less a layer at decode's batch 1.

`form_next_norms` replaces each such norm by `NormAfterMoe` and gives the FusedMoE before it
the twin's `formed_with` (`FusedMoE.with_next_norm`). Where PARASHIFT_MOE_NEXT_NORM=1 (read at each call: a CUDA graph
keeps what its capture read), the norm before the experts hands them the residual
(layers/norm_router.py); the FusedMoE asks this twin to run its experts with the norm
(`formed_with`: one row on CUDA, the small path, one rank's experts giving the whole output),
and the twin, called next with that very output and residual (the decoder calls the MLP,
returns, and the next layer or the model calls its norm, nothing in between), returns what
the kernel wrote. Else the twin is the norm it replaced."""
import os

import torch

from parashift.kernels import use_triton
from parashift.layers.layernorm import RMSNorm

ENV = "PARASHIFT_MOE_NEXT_NORM"
MODES = ("0", "1")


def enabled() -> bool:
    value = os.environ.get(ENV, "0")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {list(MODES)}")
    return value == "1"


class NormAfterMoe(RMSNorm):
    """An RMSNorm that a FusedMoE before it may form in its experts' down kernel."""

    def __init__(self, norm: RMSNorm):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self._plain = norm.forward  # a method: no submodule
        # (experts' output, residual, normed, new residual) formed for the next call
        self._held: tuple | None = None

    def formed_with(self, experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    residual: torch.Tensor) -> torch.Tensor | None:
        """The experts' output of x with this norm of it + residual formed in their down
        kernel and held for this norm's next call; None where that does not apply."""
        if not (enabled() and use_triton(x)):
            return None
        layout = experts.unreduced_layout()
        if layout is None:
            return None
        from parashift.kernels import moe_small
        gate_up, down, scales = layout
        if not (moe_small.takes(ids.numel(), fp8=scales is not None)
                and moe_small.takes_norm(x, residual, self.weight)):
            return None
        normed, new_residual = torch.empty_like(x), torch.empty_like(x)
        out = moe_small.small_experts(x, weights, ids, gate_up, down, experts.first_expert,
                                      scales, norm=(residual, self.weight, self.eps, normed,
                                                    new_residual))
        self._held = out, residual, normed, new_residual
        return out

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        held, self._held = self._held, None
        if held is None:
            return self._plain(x, residual)
        if held[0] is not x or held[1] is not residual:
            raise RuntimeError("the experts before formed this norm, but it was called with "
                               "another tensor")
        return held[2], held[3]


def form_next_norms(sites) -> int:
    """For each (FusedMoE, module, name of the norm after it) whose norm is a plain RMSNorm
    (one another pass made a fusing twin of, e.g. FP8 rows for the next layer, stays): that
    norm replaced by its twin, which the FusedMoE may form; returns how many."""
    replaced = 0
    for moe, module, name in sites:
        norm = getattr(module, name)
        if type(norm) is RMSNorm:
            twin = NormAfterMoe(norm)
            setattr(module, name, twin)
            moe.with_next_norm = twin.formed_with
            replaced += 1
    return replaced
