"""The attention's output handed to o_proj in E4M3 (issue 60): layers/fp8_input.py's quantizing
twin for the attention -> o_proj pair.

In a decode step the Triton backend's one-launch kernel, unsplit (8B heads: from 2 programs an
SM, e.g. 64 rows), writes the output rows in E4M3 with their per-row scales beside the bf16
output (attention/triton_decode_fp8_out.py, bit for bit `fp8_gemm.quantize_rows` of it), so
o_proj's FP8 x FP8 GEMM takes them instead of launching its own quantization kernel. The twin
asks for them (attention/fp8_output.py) where o_proj's GEMM for that many rows quantizes
(`LinearBase.quantizes_input`) and PARASHIFT_ATTN_O_FP8 is on; any other launch (prefill, split
decodes, the other backends, an FP8 pool scaled after the attention) answers nothing and o_proj
quantizes itself as before. The model flattens the heads before o_proj, so the rows are
taken for the output or a flattened view of it (fp8_handoff.FlattenedHandoff).

PARASHIFT_ATTN_O_FP8 (read at each call: a CUDA graph keeps what its capture read) is off by
default: unmeasured on the GPU (scripts/gpu_oquant.sh measures it)."""
import torch

from parashift.attention import fp8_output
from parashift.engine_switches import switch
from parashift.kernels import use_triton
from parashift.layers.attention import Attention
from parashift.layers.fp8_handoff import FlattenedHandoff
from parashift.layers.linear import LinearBase

ATTN_O_FP8_ENV = "PARASHIFT_ATTN_O_FP8"


def enabled() -> bool:
    """PARASHIFT_ATTN_O_FP8 (read at each call; off by default: unmeasured)."""
    return switch(ATTN_O_FP8_ENV, "0")


class QuantizingAttention(Attention):
    """An Attention layer whose output feeds an FP8 layer (o_proj). Made by re-classing the
    layer itself (`QuantizingAttention(attn, o_proj)` returns attn): its parameters' loaders
    (the FP8 pool's scales) are bound to it, and the model runner binds its KV pool to it."""

    def __new__(cls, attn: Attention | None = None, consumer: LinearBase | None = None):
        if attn is None:  # copy's and pickle's
            return super().__new__(cls)
        attn.__class__ = cls
        return attn

    def __init__(self, attn: Attention, consumer: LinearBase):  # noqa: D107  (no super(): kept)
        self.handoff = consumer.fp8_input = FlattenedHandoff()
        self._consumer_quantizes = consumer.quantizes_input  # a method: not a submodule

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        if not (enabled() and use_triton(q)
                and self._consumer_quantizes(q.shape[0], q.dtype, q.device)):
            return super().forward(positions, q, k, v)
        with fp8_output.requested() as request:
            out = super().forward(positions, q, k, v)
        if request.made is not None and request.made[0] is out:
            self.handoff.put(*request.made)
        return out
