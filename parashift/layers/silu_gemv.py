"""SiLU-and-mul inside the gate_up GEMV before it at one to four rows (decode; the kernels:
kernels/gated_gemv.py).

A model names its (gate_up layer, SiLU-and-mul, down layer) triples by attribute path
(`silu_gemv_triples` on a module class); `fuse_silu_into_gemv` replaces each such
SiLU-and-mul by `SiluIntoGemv` where the layers run the default mode's GEMMs, and gives the
gate_up layer a hook (`LinearBase.gemm_hook`: its `take(x, part)` may compute the layer's
GEMM instead). At run time, where the layer's weight (under the active layout: one part, its
output one [gate | up] block) at that many rows measured faster fused (`gated_gemv.choice`),
the hook computes silu(gate) * up in its GEMV and hands the tensor to the twin, which
returns it as it is when called with that very tensor. Else the twin is the plain op. The
MLP calls them in a row (down(act(gate_up(x)))), under one layout, so the tensor is the one
handed over.

PARASHIFT_SILU_GEMV: gate_up (the default: the same bits as unfused, 1.027x a bf16 8B
layer's decode kernels at one row on an H200, 1.002x FP8; benchmarks/decode_chain.py) or 0
(off). (Its `down` place, SiLU-and-mul in the down GEMV, was never faster: removed in
session 51.)"""
import os

import torch

from parashift.kernels import use_triton
from parashift.layers.activation import SiluAndMul
from parashift.layers.linear import LinearBase, WeightPart

ENV = "PARASHIFT_SILU_GEMV"
MODES = ("0", "gate_up")


class GateUpHook:
    """The gate_up layer's hook: its GEMM and SiLU-and-mul in one GEMV where chosen, the
    product handed to the twin."""

    def __init__(self, twin: "SiluIntoGemv", layer: LinearBase):
        self._twin = twin
        self._single_block = lambda: layer.output_split()[0] == 1 and len(
            layer._active_parts()) == 1  # methods: no submodule

    @classmethod
    def like(cls, hook: "GateUpHook", layer: LinearBase) -> "GateUpHook":
        """A hook of this class for the layer `hook` serves, handing to its twin."""
        return cls(hook._twin, layer)

    def serves(self, x: torch.Tensor) -> bool:
        """Whether a fused kernel may compute the layer's output for x: rows of a GPU
        tensor, the layer's output one [gate | up] block of one weight part."""
        return x.dim() == 2 and use_triton(x) and self._single_block()

    def config(self, x: torch.Tensor, part: WeightPart):
        """The fused GEMV's config for x on this weight where chosen, else None."""
        if not self.serves(x):
            return None
        from parashift.kernels import gated_gemv
        return gated_gemv.choice(x, part.weight, part.scale, part.bias)

    def hand_over(self, activated: torch.Tensor) -> None:
        """silu(gate) * up, computed for the twin."""
        self._twin.activated = activated

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        config = self.config(x, part)
        if config is None:
            return None
        from parashift.kernels import gated_gemv
        activated = gated_gemv.fused_linear(x, part.weight, part.scale, part.bias, config)
        self.hand_over(activated)
        return activated


class SiluIntoGemv(SiluAndMul):
    """SiLU-and-mul formed in the gate_up projection's GEMV where measured faster."""

    def __init__(self, act: SiluAndMul, gate_up: LinearBase):
        super().__init__()
        self.torch_fn = act.torch_fn
        self.activated = None  # the GEMV's silu(gate) * up, until taken
        gate_up.gemm_hook = GateUpHook(self, gate_up)

    def forward(self, x: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        activated, self.activated = self.activated, None
        if activated is not None and activated is x:
            return x
        return super().forward(x, blocks)


def mode() -> str:
    value = os.environ.get(ENV, "gate_up")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {list(MODES)}")
    return value


def fuse_silu_into_gemv(model: torch.nn.Module) -> int:
    """Replaces each plain SiLU-and-mul of the model's `silu_gemv_triples` whose layers run
    the default mode's GEMMs (dynamic activation scales where FP8) by its fusing twin where
    PARASHIFT_SILU_GEMV is gate_up; returns how many were replaced."""
    if mode() == "0":
        return 0
    replaced = 0
    for module in list(model.modules()):
        for gate_up_path, act_name, down_path in getattr(module, "silu_gemv_triples", ()):
            act = getattr(module, act_name, None)
            if type(act) is not SiluAndMul:  # e.g. fp8_input.py's quantizing twin (FP8
                continue  # layers with PARASHIFT_FP8_FUSED_INPUT on, the default) stays
            try:
                layers = (module.get_submodule(gate_up_path), module.get_submodule(down_path))
            except AttributeError:
                continue
            if all(isinstance(layer, LinearBase) and not layer.reduction_chunks
                   and layer.input_scale is None for layer in layers):
                setattr(module, act_name, SiluIntoGemv(act, layers[0]))
                replaced += 1
    return replaced
