"""SiLU-and-mul inside the down projection's GEMV at one to four rows (decode).

A model names its (SiLU-and-mul, linear layer it feeds) pairs by attribute path
(`gated_input_pairs` on a module class); `fuse_silu_into_down` replaces each such SiLU-and-mul
by `SiluIntoDown` where the layer runs the default mode's GEMMs. At run time the twin asks
`kernels/gated_gemv.choice` whether the layer's weight (under the active layout: one part)
at that many rows measured faster with the SiLU in the GEMV; if so it returns an unwritten
tensor of the output's shape and hands [gate | up] to the layer, which computes its product
from them when called with that very tensor (`LinearBase._gemm`); else it is the plain op.
The layer is called with the twin's output directly (the MLP's forward: down(act(gate_up)))
and under the same layout, so the tensor it gets is the one handed over.

Off until its before/after on a GPU is measured: PARASHIFT_SILU_DOWN=1 switches it on."""
import os

import torch

from parashift.kernels import use_triton
from parashift.layers.activation import SiluAndMul
from parashift.layers.linear import LinearBase, WeightPart

ENV = "PARASHIFT_SILU_DOWN"


class GatedHandoff:
    """The [gate | up] rows one twin handed its layer, with the fused config, held from
    the twin's return to the layer's GEMM (taken once)."""

    def __init__(self):
        self._held = None

    def put(self, placeholder: torch.Tensor, gate_up: torch.Tensor, weight: torch.Tensor,
            config) -> None:
        self._held = (placeholder, gate_up, weight, config)

    def take(self, x: torch.Tensor, part: WeightPart) -> torch.Tensor | None:
        """The layer's output for input x from the held [gate | up], if x is the tensor the
        twin returned and part the weight it chose for; else None."""
        held, self._held = self._held, None
        if held is None or held[0] is not x or held[2] is not part.weight:
            return None
        from parashift.kernels import gated_gemv
        return gated_gemv.gated_linear(held[1], part.weight, part.scale, part.bias, held[3])


class SiluIntoDown(SiluAndMul):
    """SiLU-and-mul whose product the down projection's GEMV forms, where measured faster."""

    def __init__(self, act: SiluAndMul, consumer: LinearBase):
        super().__init__()
        self.torch_fn = act.torch_fn
        self.handoff = consumer.gated_input = GatedHandoff()
        self._parts = consumer._active_parts  # a method: not a submodule
        self._static_input = consumer.input_scale is not None

    def forward(self, x: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        part = self._fused_part(x, blocks)
        config = None
        if part is not None:
            from parashift.kernels import gated_gemv
            config = gated_gemv.choice(x, part.weight, part.scale, part.bias)
        if config is None:
            return super().forward(x, blocks)
        placeholder = x.new_empty(x.shape[0], x.shape[1] // 2)
        self.handoff.put(placeholder, x, part.weight, config)
        return placeholder

    def _fused_part(self, x: torch.Tensor, blocks: int) -> WeightPart | None:
        """The layer's one weight part where the fused GEMV may serve x, else None."""
        if blocks != 1 or x.dim() != 2 or not use_triton(x) or self._static_input:
            return None
        parts = self._parts()
        if len(parts) != 1 or parts[0].weight.shape[1] * 2 != x.shape[1]:
            return None
        return parts[0]


def enabled() -> bool:
    value = os.environ.get(ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: expected 0 (off) or 1 (on)")
    return value == "1"


def fuse_silu_into_down(model: torch.nn.Module) -> int:
    """Replaces each plain SiLU-and-mul of the model's `gated_input_pairs` whose layer runs
    the default mode's GEMMs by its fusing twin (where PARASHIFT_SILU_DOWN is on); returns
    how many were replaced."""
    if not enabled():
        return 0
    replaced = 0
    for module in list(model.modules()):
        for producer_name, consumer_path in getattr(module, "gated_input_pairs", ()):
            producer = getattr(module, producer_name, None)
            if type(producer) is not SiluAndMul:  # e.g. fp8_input.py's quantizing twin
                continue
            try:
                consumer = module.get_submodule(consumer_path)
            except AttributeError:
                continue
            if isinstance(consumer, LinearBase) and not consumer.reduction_chunks:
                setattr(module, producer_name, SiluIntoDown(producer, consumer))
                replaced += 1
    return replaced
