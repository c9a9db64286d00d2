"""The RMSNorm (with the residual add) before a linear layer computed inside that layer's GEMV
at one to four rows (decode; the kernels: kernels/norm_gemv.py).

A model names its (RMSNorm, linear layer it feeds) pairs by attribute path
(`norm_gemv_pairs` on a module class); `fuse_norm_into_gemv` replaces each such norm by
`NormIntoGemv` where the layer runs the default mode's GEMMs, and gives the layer a hook
(`LinearBase.gemm_hook`, wrapping the hook it had: gate_up's SiLU one, layers/silu_gemv.py).
At run time, where the layer's one weight part at that many rows measured faster fused
(`norm_gemv.choice`), the twin returns an unwritten tensor of the norm's output's shape (and
the new residual, written by the GEMV) and hands x and the residual to the hook, which
computes the layer's output from them when called with that very tensor; where the layer's
SiLU hook fuses SiLU-and-mul into its GEMV, the one GEMV does both and hands the product on.
Else (and for the first layer's norm, which has no residual to add) the twin is the norm it
replaced. The decoder layer calls the norm and then the layer
(through its attention or MLP, nothing in between), so the tensor is the one handed over;
a layer called with another tensor while one is held is an error, not a silent misread.

PARASHIFT_NORM_IN_GEMV=1 lets the measured choice fuse; 0 (the default) keeps every norm its
own kernel. Off by default: on one H200 (8B shape, one row, docs/benchmark_log.md) the choice,
timed in the decode chain, fused only bf16's QKV (a layer's decode kernels 1.011x, 1.018x with
gate_up's SiLU fused too), never FP8's (the fused GEMV streams the weight up to ~10% slower
than the plain one; FP8 decode b1 2.7687 ms against 2.7669), start-up took ~20 s longer
(compiling and timing the candidates), and the engine's greedy tokens with it are not yet
checked on a GPU (tests/layers/test_norm_gemv.py). Never in deterministic mode (its own
GEMMs), nor for FP8 layers with static activation scales."""
import os
from typing import NamedTuple

import torch

from parashift.kernels import use_triton
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.layernorm import RMSNorm
from parashift.layers.linear import LinearBase, WeightPart
from parashift.layers.silu_gemv import GateUpHook

ENV = "PARASHIFT_NORM_IN_GEMV"
MODES = ("0", "1")


class HeldNorm(NamedTuple):
    placeholder: torch.Tensor  # what the twin returned as the norm's output
    x: torch.Tensor
    residual: torch.Tensor
    new_residual: torch.Tensor  # returned by the twin, written by the GEMV
    norm: RMSNorm
    weight: torch.Tensor  # the layer's weight the config was chosen for
    config: object
    silu_config: object


class NormHook:
    """The layer's hook: the norm's input, held from the twin's return to the layer's GEMM
    (taken once); the layer's other hook's (`inner`) otherwise."""

    def __init__(self, inner):
        self.inner = inner
        self._held: HeldNorm | None = None

    def put(self, held: HeldNorm) -> None:
        self._held = held

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        held, self._held = self._held, None
        if held is None:
            return None if self.inner is None else self.inner.take(x, part, x_fp8)
        if held.placeholder is not x or held.weight is not part.weight:
            raise RuntimeError("a norm handed its input to this layer's GEMV, but the layer "
                               "was called with another tensor or weight")
        from parashift.kernels import norm_gemv
        silu = held.silu_config is not None
        y, _ = norm_gemv.fused_linear(held.x, held.residual, held.norm.weight, held.norm.eps,
                                      part.weight, part.scale, part.bias, held.config, silu,
                                      held.new_residual)
        if silu:
            self.inner.hand_over(y)
        return y


class NormIntoGemv(RMSNorm):
    """An RMSNorm formed in the next layer's GEMV where measured faster."""

    def __init__(self, norm: RMSNorm, consumer: LinearBase):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self._plain = norm.forward  # the norm replaced (fp8_input.py's twin, say): a method
        self._parts = consumer._active_parts  # methods: no submodule
        self._blocks = consumer.output_split
        self.hook = consumer.gemm_hook = NormHook(consumer.gemm_hook)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        part = self._part(x) if residual is not None else None  # the first layer's: as is
        config = silu_config = None
        if part is not None:
            from parashift.kernels import norm_gemv
            inner = self.hook.inner
            if isinstance(inner, GateUpHook):
                silu_config = inner.config(x, part)
            config = norm_gemv.choice(x, residual, self.weight, self.eps, part.weight,
                                      part.scale, part.bias, silu_config)
        if config is None:
            return self._plain(x, residual)
        placeholder, new_residual = torch.empty_like(x), torch.empty_like(x)
        self.hook.put(HeldNorm(placeholder, x, residual, new_residual, self, part.weight,
                               config, silu_config))
        return placeholder, new_residual

    def _part(self, x: torch.Tensor) -> WeightPart | None:
        """The layer's one weight part where the fused GEMV may serve x, else None."""
        if x.dim() != 2 or not use_triton(x) or self._blocks()[0] != 1:
            return None
        parts = self._parts()
        return parts[0] if len(parts) == 1 else None


def mode() -> str:
    value = os.environ.get(ENV, "0")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {list(MODES)}")
    return value


def takes_norm(layer) -> bool:
    """A linear layer running the default mode's GEMMs (dynamic activation scales where FP8)."""
    return (isinstance(layer, LinearBase) and not layer.reduction_chunks
            and layer.input_scale is None)


def fuse_norm_into_gemv(model: torch.nn.Module) -> int:
    """Replaces each RMSNorm of the model's `norm_gemv_pairs` whose layer takes it by its
    fusing twin where PARASHIFT_NORM_IN_GEMV=1; returns how many were replaced. After the SiLU
    fusion's hooks are in place (wrapped here)."""
    if mode() == "0":
        return 0
    replaced = 0
    for module, name, norm, consumer in declared_pairs(model, "norm_gemv_pairs"):
        if (isinstance(norm, RMSNorm) and not isinstance(norm, NormIntoGemv)
                and takes_norm(consumer)):
            setattr(module, name, NormIntoGemv(norm, consumer))
            replaced += 1
    return replaced
