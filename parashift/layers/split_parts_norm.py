"""A split-K GEMM whose parts the residual-add RMSNorm after it sums (issues 60/61: decode at
33-64 rows; the kernels: kernels/parts_rmsnorm.py, the choice kernels/split_parts_choice.py).

A model names its (RMSNorm, linear layer feeding it) pairs by submodule path
(`split_parts_norm_pairs` on a module: the Llama decoder's post-attention norm and o_proj;
the Llama stack's next input norm, or the final norm, and each layer's down projection);
`hand_over_split_parts` turns each such norm (plain or FP8-quantizing, layers/fp8_input.py)
into its summing twin (the same module, its class swapped: parameters and names kept) and
gives the layer a hook (`LinearBase.gemm_hook`). At run time, unless
PARASHIFT_SPLIT_PARTS_NORM=0, where the pair at that many rows measured faster with parts
(`split_parts_choice.choice`), the hook runs the parts-out GEMM, hands the parts to the
twin and returns an unwritten tensor of the layer's output's shape; the twin, called with
that very tensor, sums the parts in its kernel (the bits of the ticket path's sum and the
plain norm). The model calls the layer (o_proj through the attention, down through the MLP)
and then the norm (the decoder layer's, or after the stack's loop hands the MLP's output to
the next layer) with nothing reading the output in between; a norm called with another
tensor while parts are held is an error, not a silent misread. A norm that a later pass
replaces (the MoE's routing norm, layers/norm_router.py, wraps the twin) leaves the hook
idle, and so does a forward hook on any module between the layer and its norm (SiDP's CaS
gathers an FFN block's rows). Only for one TP rank (the output is not all-reduced), no bias,
the default mode's GEMMs (never deterministic mode); not across a pipeline stage's end (the
stage's last down has no norm after it on this rank)."""
import torch

from parashift.context import get_context
from parashift.kernels import use_triton
from parashift.layers.fp8_input import QuantizingRMSNorm
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.layernorm import RMSNorm
from parashift.layers.linear import RowParallelLinear, WeightPart, linear


class PartsHandoff:
    """The parts one GEMM left for its norm, from the hook's return to the norm's call."""

    def __init__(self):
        self._held = None

    def put(self, placeholder: torch.Tensor, parts: tuple) -> None:
        self._held = (placeholder, parts)

    def take(self, x: torch.Tensor) -> tuple | None:
        """(parts, weight scales, token scales) if x is the tensor the hook returned; None
        where nothing is held; an error where parts are held for another tensor."""
        held, self._held = self._held, None
        if held is None:
            return None
        if held[0] is not x:
            raise RuntimeError("a split GEMM's parts are held for another tensor than the "
                               "norm's input: something came between the layer and its norm")
        return held[1]


class PartsOutHook:
    """The layer's hook: its GEMM as parts for the twin norm, where chosen."""

    def __init__(self, norm: "SumsParts", module: torch.nn.Module, name: str, layer_path: str):
        self._norm_quantizes = norm.quantizes  # methods: no submodule
        self._handoff = norm.parts_input
        self._weight = lambda: norm.weight
        self._eps = norm.eps
        # a later pass may put another norm in the twin's place (the MoE's routing norm)
        self._wired = lambda: module.get_submodule(name) is norm
        self._between = [module.get_submodule(path) for path in _prefixes(layer_path)
                         + _prefixes(name)]

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        from parashift.kernels import split_parts_choice
        if (not split_parts_choice.enabled() or not use_triton(x) or part.bias is not None
                or get_context().tp.size != 1 or not self._wired() or self._hooked()
                or not split_parts_choice.serves(x, part.weight, part.scale)):
            return None
        config = split_parts_choice.choice(x, part.weight, part.scale, self._weight(),
                                           self._eps, self._norm_quantizes(x))
        if config is None:
            return None
        parts = split_parts_choice.parts_of(x, part.weight, part.scale, config, x_fp8)
        placeholder = x.new_empty(x.shape[0], part.weight.shape[0])
        self._handoff.put(placeholder, parts)
        return placeholder

    def _hooked(self) -> bool:
        """Whether a forward hook sits between the layer and its norm (SiDP's CaS gathers
        an FFN block's rows and reduce-scatters its output): the unwritten output would be
        read."""
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._between)


def _prefixes(path: str) -> list[str]:
    """"a.b.c" -> ["a", "a.b", "a.b.c"]."""
    names = path.split(".")
    return [".".join(names[:i]) for i in range(1, len(names) + 1)]


class SumsParts:
    """The twins' forward: the held parts summed into the norm where x is their tensor."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        held = self.parts_input.take(x)
        if held is None:
            return super().forward(x, residual)
        if residual is None:
            raise RuntimeError("a split GEMM's parts reached a norm without a residual")
        from parashift.kernels.parts_rmsnorm import parts_add_rms_norm
        quant = self.quantizes(x)
        outputs = parts_add_rms_norm(*held, residual, self.weight, self.eps, quant)
        if quant:
            self.handoff.put(outputs[0], outputs[2], outputs[3])
        return outputs[0], outputs[1]


class PartsRMSNorm(SumsParts, RMSNorm):
    def quantizes(self, x: torch.Tensor) -> bool:
        return False


class PartsQuantizingRMSNorm(SumsParts, QuantizingRMSNorm):
    def quantizes(self, x: torch.Tensor) -> bool:
        """Whether the norm writes its output in E4M3 for its FP8 consumer."""
        return self._fuses(x, torch.promote_types(x.dtype, self.weight.dtype))


TWINS = {RMSNorm: PartsRMSNorm, QuantizingRMSNorm: PartsQuantizingRMSNorm}


def takes_parts(layer) -> bool:
    """A row-parallel layer of one TP rank, no bias, the default mode's GEMM, no hook."""
    return (isinstance(layer, RowParallelLinear) and layer.tp_size == 1
            and layer.bias is None and not layer.reduction_chunks and layer.matmul is linear
            and layer.input_scale is None and layer.gemm_hook is None)


def hand_over_split_parts(model: torch.nn.Module) -> int:
    """Makes each norm of the model's `split_parts_norm_pairs` whose layer takes parts its
    summing twin and hooks the layer; returns how many pairs were wired. After the FP8
    input twins (layers/fp8_input.py) are in place."""
    wired = 0
    for module, name, norm, layer in declared_pairs(model, "split_parts_norm_pairs"):
        twin = TWINS.get(type(norm))
        if twin is not None and takes_parts(layer):
            norm.__class__ = twin
            norm.parts_input = PartsHandoff()
            layer_path = next(path for path, m in module.named_modules() if m is layer)
            layer.gemm_hook = PartsOutHook(norm, module, name, layer_path)
            wired += 1
    return wired
