"""FP8 activations made by the op before an FP8 linear layer (issue 60).

The FP8 GEMMs that multiply FP8 by FP8 (cuBLASLt, the w8a8 Triton configs) quantize their
input per token first: a kernel of its own before every such linear layer. Where the op
before is an RMSNorm (QKV after the input norm, gate_up after the post-attention norm) or
SiLU-and-mul (down), its kernel can write the rows in E4M3 with their scales as it writes
them (`kernels/rmsnorm.py`'s `rms_norm_fp8`, `kernels/silu_mul.py`'s `silu_and_mul_fp8`,
bit for bit what `fp8_gemm.quantize_rows` makes of its output) and hand them to the layer.

A model names its (producer, consumer) pairs by attribute path (`fp8_input_pairs` on a
module class); `hand_over_fp8_inputs` replaces each producer by its quantizing twin (same
parameters) where the consumer is an FP8 layer with dynamic activation scales in the
default mode. At run time the twin quantizes only on the GPU and where the consumer's GEMM
for that many rows quantizes (`LinearBase.quantizes_input`); else it is the plain op. The
consumer takes the rows only if it is called with the very tensor the producer returned
(a design changing the tensor in between, e.g. SiDP's gather, gives another one: the
layer then quantizes its input itself). On by default (PARASHIFT_FP8_FUSED_INPUT=1: both
kinds; =norm the RMSNorms only, =silu the SiLU-and-muls only, =norm,silu both; 0 keeps every
op plain): on one H200, 8B shape, a 4,096-token prefill step took 64.4 ms against 66.4 without
(interleaved in one process, medians of 4), decode b1 and b64 on par (session 43)."""
import os

import torch
from torch import nn

from parashift.kernels import use_triton
from parashift.layers.activation import SiluAndMul
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.layernorm import RMSNorm
from parashift.layers.linear import LinearBase


class FP8Handoff:
    """The rows one producer quantized for its consumer, held from the producer's return to
    the consumer's call (taken once, so a step's activations are not kept)."""

    def __init__(self):
        self._held: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def put(self, source: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor) -> None:
        self._held = (source, rows, scales)

    def take(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(E4M3 rows, fp32 scales [rows, 1]) if x is the tensor they were made of."""
        held, self._held = self._held, None
        if held is None or held[0] is not x:
            return None
        return held[1], held[2]


class _Producer:
    """What the quantizing twins share: their consumer's handoff and question."""

    def _attach(self, consumer: LinearBase) -> None:
        self.handoff = consumer.fp8_input = FP8Handoff()
        self._consumer_quantizes = consumer.quantizes_input  # a method: not a submodule

    def _fuses(self, x: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether to hand over the output of x's rows (the output in `dtype`)."""
        return use_triton(x) and self._consumer_quantizes(x.numel() // max(x.shape[-1], 1),
                                                          dtype, x.device)


class QuantizingRMSNorm(_Producer, RMSNorm):
    """An RMSNorm (with the residual add, where given) whose output feeds an FP8 layer."""

    def __init__(self, norm: RMSNorm, consumer: LinearBase):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self._attach(consumer)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
        if not self._fuses(x, torch.promote_types(dtype, self.weight.dtype)):
            return super().forward(x, residual)
        from parashift.kernels import rmsnorm
        out, new_x, rows, scales = rmsnorm.rms_norm_fp8(x, residual, self.weight, self.eps)
        self.handoff.put(out, rows, scales)
        return out if residual is None else (out, new_x)


class QuantizingSiluAndMul(_Producer, SiluAndMul):
    """SiLU-and-mul whose output feeds an FP8 layer (the down projection)."""

    def __init__(self, act: SiluAndMul, consumer: LinearBase):
        super().__init__()
        self.torch_fn = act.torch_fn
        self._attach(consumer)

    def forward(self, x: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        if not self._fuses(x, x.dtype):
            return super().forward(x, blocks)
        from parashift.kernels import silu_mul
        out, rows, scales = silu_mul.silu_and_mul_fp8(x, blocks)
        self.handoff.put(out, rows, scales)
        return out


QUANTIZING = {RMSNorm: QuantizingRMSNorm, SiluAndMul: QuantizingSiluAndMul}
# PARASHIFT_FP8_FUSED_INPUT's names of the twins, for a comma-separated list; 1 is all of them
TWIN_NAMES = {"norm": QuantizingRMSNorm, "silu": QuantizingSiluAndMul}


def fused_twins() -> set[type]:
    """The quantizing twins PARASHIFT_FP8_FUSED_INPUT switches on (all by default)."""
    mode = os.environ.get("PARASHIFT_FP8_FUSED_INPUT", "1")
    names = {"0": [], "1": list(TWIN_NAMES)}.get(mode, mode.split(","))
    if not set(names) <= set(TWIN_NAMES):
        raise ValueError(f"PARASHIFT_FP8_FUSED_INPUT={mode!r}: expected 0, 1 or a "
                         f"comma-separated list of {list(TWIN_NAMES)}")
    return {TWIN_NAMES[name] for name in names}


def takes_fp8_input(layer: nn.Module) -> bool:
    """An FP8 linear layer quantizing its input per token at run time (dynamic scales, the
    default mode's GEMMs)."""
    return (isinstance(layer, LinearBase) and layer.quant is not None
            and layer.input_scale is None and not layer.reduction_chunks)


def hand_over_fp8_inputs(model: nn.Module) -> int:
    """Replaces each producer of the model's `fp8_input_pairs` whose consumer takes FP8
    input by its quantizing twin; returns how many were replaced."""
    twins, replaced = fused_twins(), 0
    if not twins:
        return 0
    for module, name, producer, consumer in declared_pairs(model, "fp8_input_pairs"):
        twin = QUANTIZING.get(type(producer))
        if twin in twins and takes_fp8_input(consumer):
            setattr(module, name, twin(producer, consumer))
            replaced += 1
    return replaced
