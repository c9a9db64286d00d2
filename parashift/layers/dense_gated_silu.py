"""SiLU-and-mul formed by 16-bit gate_up's GEMM at 33-64 rows (the kernel:
kernels/dense_gated_tma.py; the choice: kernels/dense_gated_choice.py).

Where silu_gemv.py gave a gate_up layer its GEMV hook (`GateUpHook`: the SiLU fused into the
one-to-four-row GEMV, PARASHIFT_SILU_GEMV=gate_up, the default),
`fuse_silu_into_dense_gate_up` swaps that hook for `DenseGateUpHook`, the same hook with the
wider rows added: unless PARASHIFT_DENSE_GATE_UP_SILU=0 (read at each call: a CUDA graph keeps
what its capture read), the layer's one weight part is one [gate | up] block of x's 16-bit
dtype and the choice timed the fusion faster than the dense GEMM then SiLU-and-mul, the hook
computes the product and hands it to the twin (`SiluIntoGemv`), which returns it as it is.
Else the GEMV hook's own. Deterministic mode keeps its GEMMs: silu_gemv.py gives its layers
no hook.

On by default (1): the 8B bf16 decode step at 64 rows 1.0076x faster with it on an H200 (three
interleaved rounds, each faster: 6.566-6.621 against 6.661-6.665 ms; session 50,
benchmarks/results/raw/s50_call1/bgated/engine.json); 0 turns it off."""
import torch

from parashift.engine_switches import switch
from parashift.layers.linear import LinearBase, WeightPart
from parashift.layers.silu_gemv import GateUpHook

ENV, DEFAULT = "PARASHIFT_DENSE_GATE_UP_SILU", "1"


def enabled() -> bool:
    return switch(ENV, DEFAULT)


class DenseGateUpHook(GateUpHook):
    """gate_up's hook: its TMA GEMM with SiLU-and-mul in the epilogue at 33-64 rows where
    chosen, the GEMV hook's fusion at fewer."""

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        tiling = self.dense_tiling(x, part)
        if tiling is None:
            return super().take(x, part, x_fp8)
        from parashift.kernels import dense_gated_choice
        activated = dense_gated_choice.fused(x, part.weight, tiling)
        self.hand_over(activated)
        return activated

    def dense_tiling(self, x: torch.Tensor, part: WeightPart):
        """The fused GEMM's tiling for x on this weight where chosen, else None."""
        if not enabled() or part.scale is not None or not self.serves(x):
            return None
        from parashift.kernels import dense_gated_choice
        return dense_gated_choice.choice(x, part.weight, part.bias)


def fuse_silu_into_dense_gate_up(model: torch.nn.Module) -> int:
    """Swaps each linear layer's `GateUpHook` for `DenseGateUpHook` (after silu_gemv.py's
    pass); returns how many were swapped."""
    swapped = 0
    for layer in model.modules():
        if isinstance(layer, LinearBase) and type(layer.gemm_hook) is GateUpHook:
            layer.gemm_hook = DenseGateUpHook.like(layer.gemm_hook, layer)
            swapped += 1
    return swapped
