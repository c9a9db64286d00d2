"""SiLU-and-mul (and its rows' FP8 quantization for down) formed by FP8 gate_up's GEMM at
5-64 rows (the kernels: kernels/fp8_gated_tma.py; the choice: kernels/fp8_gated_choice.py).

Where a model's (gate_up, SiLU-and-mul, down) triple (`silu_gemv_triples`) has FP8 layers
with dynamic activation scales, the SiLU-and-mul is fp8_input.py's quantizing twin (down's
input in E4M3). `fuse_silu_into_fp8_gate_up` replaces it by `SiluInFP8GateUp` (the same op
otherwise) and gives gate_up a hook (`LinearBase.gemm_hook`). At run time, where
PARASHIFT_FP8_GATE_UP_SILU=1 (read at each call: a CUDA graph keeps what its capture read),
gate_up got its input's E4M3 rows from the norm before (fp8_input.py), its one weight part
is one [gate | up] block and the choice timed the fusion faster, the hook computes the
product, its E4M3 rows and scales, and hands them to the twin, which returns the product
when called with that very tensor and hands the rows to down. Else both are the plain ops.

On by default (1): the 8B FP8 decode step at 64 rows 1.029x faster with it on an H200 (three
interleaved rounds, session 49; benchmarks/results/raw/s49_x2/fp8_after.json); 0 turns it off."""
import torch

from parashift.engine_switches import switch
from parashift.kernels import use_triton
from parashift.layers.fp8_input import QuantizingSiluAndMul
from parashift.layers.linear import LinearBase, WeightPart

ENV, DEFAULT = "PARASHIFT_FP8_GATE_UP_SILU", "1"


def enabled() -> bool:
    return switch(ENV, DEFAULT)


class FP8GateUpHook:
    """gate_up's hook: its GEMM with SiLU-and-mul in the epilogue where chosen, the product
    and its E4M3 rows handed to the twin."""

    def __init__(self, twin: "SiluInFP8GateUp", layer: LinearBase):
        self._twin = twin
        self._single_block = lambda: layer.output_split()[0] == 1 and len(
            layer._active_parts()) == 1  # methods: no submodule

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        if x_fp8 is None or not enabled() or x.dim() != 2 or not use_triton(x) \
                or not self._single_block() or not self._twin.hands_over(x):
            return None
        from parashift.kernels import fp8_gated_choice
        tiling = fp8_gated_choice.choice(x, x_fp8, part.weight, part.scale, part.bias)
        if tiling is None:
            return None
        made = fp8_gated_choice.fused(x_fp8, part.weight, part.scale, x.dtype, tiling)
        self._twin.made = made
        return made[0]


class SiluInFP8GateUp(QuantizingSiluAndMul):
    """The quantizing SiLU-and-mul, whose output and E4M3 rows gate_up may have made."""

    def __init__(self, act: QuantizingSiluAndMul, gate_up: LinearBase, down: LinearBase):
        super().__init__(act, down)
        self.made = None  # (product, its E4M3 rows, their scales) from gate_up, until taken
        gate_up.gemm_hook = FP8GateUpHook(self, gate_up)

    def hands_over(self, x: torch.Tensor) -> bool:
        """Whether down takes E4M3 rows of gate_up's output for input x."""
        return self._fuses(x, x.dtype)

    def forward(self, x: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        made, self.made = self.made, None
        if made is not None and made[0] is x:
            self.handoff.put(*made)
            return x
        return super().forward(x, blocks)


def fuse_silu_into_fp8_gate_up(model: torch.nn.Module) -> int:
    """Replaces each quantizing SiLU-and-mul of the model's `silu_gemv_triples` whose
    gate_up has no GEMM hook yet by its twin; returns how many were replaced."""
    replaced = 0
    for module in list(model.modules()):
        for gate_up_path, act_name, down_path in getattr(module, "silu_gemv_triples", ()):
            act = getattr(module, act_name, None)
            if type(act) is not QuantizingSiluAndMul:
                continue
            try:
                gate_up, down = (module.get_submodule(gate_up_path),
                                 module.get_submodule(down_path))
            except AttributeError:
                continue
            if isinstance(gate_up, LinearBase) and gate_up.gemm_hook is None \
                    and gate_up.quant is not None and gate_up.input_scale is None \
                    and not gate_up.reduction_chunks:
                setattr(module, act_name, SiluInFP8GateUp(act, gate_up, down))
                replaced += 1
    return replaced
