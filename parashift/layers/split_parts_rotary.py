"""A split-K QKV GEMM whose parts the RoPE + KV-write kernel after it sums (issue 61: decode
at 33-64 rows; the kernels: kernels/parts_rotary.py, the choice
kernels/split_parts_rotary_choice.py).

A model names its (attention, QKV layer feeding it) pairs by submodule path
(`split_parts_rotary_pairs` on a module: the Llama attention block's attn and qkv_proj);
`hand_over_qkv_parts` turns each such attention into its summing twin (`PartsAttention`: the
same module, its class swapped) and gives the QKV layer a hook (`LinearBase.gemm_hook`). At run
time, under PARASHIFT_SPLIT_PARTS_ROTARY=1, where the pair at that many rows measured faster
with parts (`split_parts_rotary_choice.choice`) and the step's attention rotates q and k in
the rotary kernel apart (`rotate_attend.rotates_apart`: not in the decode kernel), the hook
runs the parts-out GEMM, hands the parts to the twin and returns an unwritten tensor of the
layer's output's shape; the block splits it into its q, k, v head views, and the twin, called
with those very views, sums the parts in its rotary kernel (the bits of the ticket path and
the plain rotary kernel). Should the step's path differ by then, the twin first writes the
tensor (the parts summed in torch: the same bits) and runs the plain attention; views of
another tensor while parts are held are an error, not a silent misread.

Restricted to what reads nothing in between: blocks without q/k norms (Qwen3's would read
q, k), QKV without bias, one TP rank and no sequence parallelism (an all-gather or the
Ulysses exchange would read them), the layer's own weight laid out [q | k | v] (no plan's
layout), no forward hook on the layer, the twin or the modules holding them, a 16-bit KV
pool, the default mode's GEMMs (never deterministic mode)."""
import torch

from parashift.context import get_attention_context, get_context
from parashift.kernels import use_triton
from parashift.layers.attention import Attention
from parashift.layers.fusion_pairs import declared_pairs
from parashift.layers.linear import QKVParallelLinear, WeightPart, linear
from parashift.layers.split_parts_norm import path_prefixes
from parashift.quantization.fp8 import is_fp8


class QKVPartsHandoff:
    """The parts the QKV GEMM left for the twin, from the hook's return to the twin's call."""

    def __init__(self):
        self._held = None

    def put(self, placeholder: torch.Tensor, parts: tuple) -> None:
        self._held = (placeholder, parts)

    def take(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
             ) -> tuple[torch.Tensor, tuple] | None:
        """(the tensor the hook returned, (parts, weight scales, token scales)) where q, k, v
        are its head views [q | k | v]; None where nothing is held; an error where parts are
        held for another tensor."""
        held, self._held = self._held, None
        if held is None:
            return None
        if not _head_views_of(held[0], q, k, v):
            raise RuntimeError("a split QKV GEMM's parts are held for another tensor than the "
                               "attention's q, k, v: something came between them")
        return held


def _head_views_of(qkv: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                   ) -> bool:
    rows, width = qkv.shape
    start = 0
    for view in (q, k, v):
        heads, head_dim = view.shape[1:]
        if (view.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
                or view.data_ptr() != qkv.data_ptr() + start * qkv.element_size()
                or view.shape[0] != rows or view.stride() != (width, head_dim, 1)):
            return False
        start += heads * head_dim
    return start == width


def finished_in_torch(parts: torch.Tensor, w_scale, x_scale, dtype: torch.dtype
                      ) -> torch.Tensor:
    """The GEMM's output from its parts as the ticket path's last program finishes it: the
    parts summed in part order, times the weight rows' and the tokens' scales, rounded."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    if w_scale is not None:
        total *= w_scale.reshape(1, -1)
    if x_scale is not None:
        total *= x_scale.reshape(-1, 1)
    return total.to(dtype)


class PartsAttention(Attention):
    """The attention twin: where q, k, v are views of the QKV hook's unwritten output, its
    parts summed in the rotary kernel."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        held = self.parts_input.take(q, k, v)
        if held is None:
            return super().forward(positions, q, k, v)
        placeholder, (parts, w_scale, x_scale) = held
        if not self.rotates_parts(q):
            placeholder.copy_(finished_in_torch(parts, w_scale, x_scale, placeholder.dtype))
            return super().forward(positions, q, k, v)
        from parashift.attention.rotate_attend import rotate_write_attend
        from parashift.kernels.parts_rotary import rotate_parts_and_write_kv
        ctx = get_attention_context()

        def rotate(positions, q, k, v, cos_sin, k_cache, v_cache, slot_mapping, norms):
            return rotate_parts_and_write_kv(positions, parts, w_scale, x_scale, q.shape[1],
                                             q.dtype, cos_sin, k_cache, v_cache, slot_mapping)

        return rotate_write_attend(ctx.backend, positions, q, k, v, self.rotary_emb.cos_sin,
                                   self.k_cache, self.v_cache, ctx.attn, self.scale, None,
                                   rotate)

    def rotates_parts(self, q: torch.Tensor) -> bool:
        """Whether `forward` of q (and its k, v) would run the rotary kernel apart, with
        nothing reading q, k, v before it (Attention.forward's fused path, no q/k norms)."""
        from parashift.attention.rotate_attend import rotates_apart
        ctx = get_context()  # outside a step (no attention metadata): no parts
        return (ctx.attn is not None and ctx.sp.size == 1 and use_triton(q)
                and not is_fp8(self.k_cache)
                and self.qk_norms is None
                and rotates_apart(ctx.backend, q, self.k_cache, ctx.attn))


class QKVPartsHook:
    """The QKV layer's hook: its GEMM as parts for the twin attention, where chosen."""

    def __init__(self, attn: PartsAttention, layer: QKVParallelLinear, module: torch.nn.Module,
                 name: str, layer_path: str):
        self._attn = lambda: attn  # a function: no submodule
        self._handoff = attn.parts_input
        self._base_weight = lambda: layer.weight  # a lambda: no submodule
        self._blocks = layer.output_split
        self._heads = (layer.num_heads, layer.head_dim)
        self._wired = lambda: module.get_submodule(name) is attn
        self._between = [module.get_submodule(path) for path in path_prefixes(layer_path)
                         + path_prefixes(name)]

    def take(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor | None:
        from parashift.kernels import split_parts_choice, split_parts_rotary_choice as chooser
        if (not chooser.enabled() or not use_triton(x) or part.bias is not None
                or get_context().tp.size != 1 or not self._wired() or self._hooked()
                or self._blocks()[0] != 1 or part.weight is not self._base_weight()
                or not split_parts_choice.serves(x, part.weight, part.scale)):
            return None
        heads, head_dim = self._heads
        placeholder = x.new_empty(x.shape[0], part.weight.shape[0])
        q = placeholder.unflatten(-1, (-1, head_dim))[:, :heads]
        if not self._attn().rotates_parts(q):
            return None
        config = chooser.choice(x, part.weight, part.scale, heads, head_dim,
                                self._attn().rotary_emb.cos_sin)
        if config is None:
            return None
        self._handoff.put(placeholder, chooser.parts_of(x, part.weight, part.scale, config,
                                                        x_fp8))
        return placeholder

    def _hooked(self) -> bool:
        """Whether a forward hook sits on the layer, the twin or a module between: it would
        read the unwritten output."""
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._between)


def takes_parts(module: torch.nn.Module, attn, layer) -> bool:
    """A plain attention of a block without q/k norms fed by a QKV layer of one TP rank, no
    bias, the default mode's GEMM, no hook."""
    return (type(attn) is Attention and attn.qk_norms is None
            and getattr(module, "q_norm", None) is None
            and isinstance(layer, QKVParallelLinear) and layer.tp_size == 1
            and layer.bias is None and not layer.reduction_chunks and layer.matmul is linear
            and layer.input_scale is None and layer.gemm_hook is None)


def hand_over_qkv_parts(model: torch.nn.Module) -> int:
    """Makes each attention of the model's `split_parts_rotary_pairs` whose QKV layer takes
    parts its summing twin and hooks the layer; returns how many pairs were wired. After the
    FP8 input twins (layers/fp8_input.py) are in place."""
    wired = 0
    for module, name, attn, layer in declared_pairs(model, "split_parts_rotary_pairs"):
        if takes_parts(module, attn, layer):
            attn.__class__ = PartsAttention
            attn.parts_input = QKVPartsHandoff()
            layer_path = next(path for path, m in module.named_modules() if m is layer)
            layer.gemm_hook = QKVPartsHook(attn, layer, module, name, layer_path)
            wired += 1
    return wired
