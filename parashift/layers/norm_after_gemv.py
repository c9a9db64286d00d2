"""The residual add and RMSNorm after a linear layer done by that layer's FP8 GEMV, in its
last program (decode's one to four rows; the kernel: kernels/norm_tail.py): one launch fewer
a fold (issue 60: at one row the 8B's small kernels cost the step more than their bytes,
benchmarks/step_ceiling.py).

A model names its (norm giving the residual, linear layer, norm after it) triples by path
(`norm_after_gemv_triples`: the Llama layer's o_proj with the input and post-attention
norms; the Llama model's down_proj of each layer with that layer's post-attention norm and
the next layer's input norm, the last layer's with the final norm). `fold_norm_after_gemv`
puts a `FoldedNorm` in place of each of those norms (one twin a norm in both roles) and
gives the linear layer a hook (`TailHook`). The norm giving the residual tells the hook the
residual it returns, which the decoder adds in the norm after. At run time, where the
layer's GEMM fits (FP8 weight, dynamic activation scales, its output whole on this rank: TP
1; the shape's measured choice a GEMV of one part of K, at most fp8_gemv.MAX_ROWS rows), the
hook runs that GEMV with the norm in its tail and hands the norm's outputs to the twin after
it, which returns them when called with that very output and residual (with its rows in
E4M3 handed on where the norm it replaced would quantize them for the next layer:
layers/fp8_input.py). Else each twin is the norm it replaced. The layer's output is always
computed, so a twin called with other tensors only normalises again: never a misread. Under
TP > 1 the norm needs the all-reduced row, so the fold would have to move behind the
all-reduce (not built).

PARASHIFT_NORM_AFTER_GEMV=1 turns it on where it fits; 0 (the default) leaves every norm its
own kernel. Read when the model is built (1: the twins are installed) and again at each GEMM
(so a CUDA graph keeps what its capture read, and one engine built with 1 can be timed
against 0 by graph variants). Not measured on a GPU yet (scripts/gpu_fp8b1.sh measures it).
Never in deterministic mode (its own GEMMs), nor where the norm after is another fusion's
twin (norm_gemv.py's, or a mixture of experts' routing norm: norm_router.py)."""
import torch

from parashift.context import get_context
from parashift.engine_switches import switch
from parashift.kernels import use_triton
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.fused_moe import FusedMoE
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.layernorm import RMSNorm
from parashift.layers.linear import LinearBase, WeightPart

ENV = "PARASHIFT_NORM_AFTER_GEMV"


class FoldedNorm(RMSNorm):
    """A norm of the folds, in either role or both: its outputs as the GEMV before it made
    them, where held for these inputs (else the norm it replaced); and the residual it
    returns announced to the GEMV after it (`tap`: that layer's hook), where that GEMV folds
    the next norm."""

    def __init__(self, norm: RMSNorm):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self._plain = norm.forward  # the norm replaced (fp8_input.py's twin, say): a method
        self.takes_tails = _takes_tails(norm)  # not another fusion's twin
        self._quantizes = norm.quantizes if isinstance(norm, QuantizingRMSNorm) else None
        self._handoff = getattr(norm, "handoff", None)
        self._held = None
        self.tap: "TailHook | None" = None  # not a submodule

    def quantizes(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """Whether the norm replaced would hand its output over in E4M3 for these inputs."""
        return self._quantizes is not None and self._quantizes(x, residual)

    def hold(self, y: torch.Tensor, tail) -> None:
        """The GEMV's output y and its norm tail (kernels/norm_tail.py), until the call."""
        self._held = (y, tail)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        out = self._outputs(x, residual)
        if self.tap is not None:  # without a residual the decoder keeps x as the residual
            self.tap.expect(x if residual is None else out[1])
        return out

    def _outputs(self, x: torch.Tensor, residual: torch.Tensor | None):
        held, self._held = self._held, None
        if held is None or held[0] is not x or held[1].residual is not residual:
            return self._plain(x, residual)
        tail = held[1]
        if tail.rows_fp8 is not None:
            self._handoff.put(tail.out, tail.rows_fp8, tail.scales)
        return tail.out, tail.new_residual


class TailHook:
    """The linear layer's hook: its GEMV with the norm after it in its last program, where the
    residual is expected and the GEMM fits; the layer's other hook's otherwise."""

    def __init__(self, inner, norm: FoldedNorm):
        self.inner = inner
        self._norm = norm
        self._residual: torch.Tensor | None = None

    def expect(self, residual: torch.Tensor) -> None:
        """The residual the norm after the layer will be given (taken by the next GEMM)."""
        self._residual = residual

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        """x_fp8: x's E4M3 rows made by the op before, if any (then no fold: the one-row
        GEMV reads 16-bit x, and the unfolded GEMM would read those rows)."""
        residual, self._residual = self._residual, None
        fits = residual is not None and x_fp8 is None and enabled()
        config = self._config(x, residual, part) if fits else None
        if config is None:
            return None if self.inner is None else self.inner.take(x, part, x_fp8)
        from parashift.kernels import fp8_gemv, norm_tail
        norm = self._norm
        tail = norm_tail.norm_tail(residual, norm.weight, norm.eps,
                                   norm.quantizes(residual, residual))  # y's shape and dtype
        y = fp8_gemv.fp8_gemv(x, part.weight, part.scale, part.bias, config.block_n,
                              config.block_k, config.num_warps, config.num_stages,
                              ahead=config.ahead, tail=tail)
        norm.hold(y, tail)
        return y

    def _config(self, x: torch.Tensor, residual: torch.Tensor, part: WeightPart):
        """The layer's measured GEMV config for x where the fold fits, else None."""
        from parashift.kernels import fp8_gemm, fp8_gemv, split_tickets
        if (x.dim() != 2 or not 1 <= x.shape[0] <= fp8_gemv.MAX_ROWS or not use_triton(x)
                or part.scale is None or part.weight.stride(1) != 1
                or residual.shape != (x.shape[0], part.weight.shape[0])
                or residual.dtype != x.dtype or residual.stride(1) != 1
                or self._norm.weight.dtype != x.dtype):
            return None
        # made here at an eager call, so that a CUDA graph capture finds them
        if split_tickets.counters(x.device, 1) is None or get_context().tp.size != 1:
            return None
        config = fp8_gemm.measured_choice(x.shape[0], part.weight, x.dtype, x.device,
                                          part.bias is not None)
        if config is None or config.kernel != "gemv" or config.split_k != 1:
            return None
        return config


def enabled() -> bool:
    """PARASHIFT_NORM_AFTER_GEMV: 1 on, 0 (or unset) off, anything else an error."""
    return switch(ENV, "0")


def _folds_into(layer) -> bool:
    """An FP8 linear layer running the default mode's GEMMs with dynamic activation scales,
    its output whole on the rank (TP 1)."""
    return (isinstance(layer, LinearBase) and layer.quant is not None
            and layer.input_scale is None and not layer.reduction_chunks
            and layer.tp_size == 1)


def fold_norm_after_gemv(model: torch.nn.Module) -> int:
    """Installs the twins and hook of each of the model's `norm_after_gemv_triples` that fits
    where PARASHIFT_NORM_AFTER_GEMV=1; returns how many."""
    if not enabled():
        return 0
    routed = {id(norm) for _, _, norm, consumer in declared_pairs(model, "norm_router_pairs")
              if isinstance(consumer, FusedMoE)}
    folded = 0
    for module in list(model.modules()):
        for before_path, layer_path, after_path in getattr(module, "norm_after_gemv_triples",
                                                           ()):
            before, layer, after = (_submodule(module, p) for p in (before_path, layer_path,
                                                                     after_path))
            if (not isinstance(before, RMSNorm) or not _takes_tails(after)
                    or id(after) in routed or not _folds_into(layer)):
                continue
            after = _twin(module, after_path)
            hook = layer.gemm_hook = TailHook(layer.gemm_hook, after)
            _twin(module, before_path).tap = hook
            folded += 1
    return folded


def _takes_tails(norm) -> bool:
    return norm.takes_tails if isinstance(norm, FoldedNorm) else type(norm) in (
        RMSNorm, QuantizingRMSNorm)


def _submodule(module: torch.nn.Module, path: str):
    try:
        return module.get_submodule(path)
    except AttributeError:  # e.g. a mixture of experts' layer: no dense MLP
        return None


def _twin(module: torch.nn.Module, path: str) -> FoldedNorm:
    """The norm at path as a FoldedNorm (put in its place where it is not one yet)."""
    norm = module.get_submodule(path)
    if not isinstance(norm, FoldedNorm):
        parent, _, name = path.rpartition(".")
        norm = FoldedNorm(norm)
        setattr(module.get_submodule(parent) if parent else module, name, norm)
    return norm
