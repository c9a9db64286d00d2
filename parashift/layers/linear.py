"""Linear layers sharded over the active plan's TP group.

Each parameter carries a `weight_loader(param, loaded_weight, shard_id)` that
copies this rank's slice of a full (unsharded) checkpoint tensor."""
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from parashift.deterministic import matmul as invariant
from parashift.deterministic.reduction import row_parallel_linear
from parashift.kernels import use_triton
from parashift.lazy_tensor import as_tensor
from parashift.context import BASE_WEIGHTS, get_context
from parashift.quantization.fp8 import FP8, dequantize, fp8_linear, quantizes_per_token
from parashift.quantization.loading import QuantizingTarget, check_serialized, scale_rows


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel degree {d}")
    return n // d


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if use_triton(x):
        from parashift.kernels import dense_gemm, skinny_gemm
        if dense_gemm.handles(x):
            return dense_gemm.linear(x, weight, bias)
        return skinny_gemm.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def wide_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, or at decode's wider batches on CUDA kernels/dense_gemm.py's choice (the LM
    head's GEMM: at 1-4 rows it stays on cuBLAS)."""
    if use_triton(x):
        from parashift.kernels import dense_gemm
        if dense_gemm.handles(x):
            return dense_gemm.linear(x, weight, bias)
    return F.linear(x, weight, bias)


class WeightPart(NamedTuple):
    """One GEMM's weight: the matrix, its bias and, for an FP8 matrix, its scale per output
    row ([rows, 1]). Rows are sliced together; input columns leave bias and scale whole."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: torch.Tensor | None = None

    def rows(self, offset: int, size: int) -> "WeightPart":
        return WeightPart(*(None if t is None else t.narrow(0, offset, size) for t in self))

    def columns(self, offset: int, size: int) -> "WeightPart":
        return WeightPart(self.weight.narrow(1, offset, size), self.bias, self.scale)

    def dense(self, dtype: torch.dtype) -> "WeightPart":
        """The part with its weight dequantized (for GEMMs that take no FP8)."""
        if self.scale is None:
            return self
        return WeightPart(dequantize(self.weight, self.scale, dtype), self.bias)

    @staticmethod
    def cat(parts: list["WeightPart"]) -> "WeightPart":
        return WeightPart(*(None if ts[0] is None else torch.cat(ts) for ts in zip(*parts)))


def _load_max(param: nn.Parameter, loaded, shard_id=None) -> None:
    """A static activation scale of packed matrices: the largest of theirs."""
    param.data.copy_(torch.maximum(param.data, as_tensor(loaded).float().reshape(1)))


def _permute_units(t: torch.Tensor, sources: list[int], unit: int) -> None:
    """Reorders `t`'s blocks of `unit` rows in place: block i takes the old block
    sources[i]. Each cycle of the permutation parks its first block in one block of scratch."""
    def block(i: int) -> torch.Tensor:
        return t[i * unit:(i + 1) * unit]
    scratch, placed = torch.empty_like(block(0)), [False] * len(sources)
    for start in range(len(sources)):
        if placed[start] or sources[start] == start:
            continue
        scratch.copy_(block(start))
        i = start
        while sources[i] != start:
            block(i).copy_(block(sources[i]))
            placed[i], i = True, sources[i]
        block(i).copy_(scratch)
        placed[i] = True


class LinearBase(nn.Module):
    """y = x W^T + b with W sharded along `tp_dim` (0: output, 1: input)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None):
        super().__init__()
        ctx = get_context()
        self.tp_size, self.tp_rank, self.tp_dim = ctx.tp.size, ctx.tp.rank, tp_dim
        # deterministic mode: batch-invariant GEMMs, row-parallel K in this many chunks
        self.reduction_chunks = ctx.reduction_chunks
        self.matmul = invariant.linear if ctx.reduction_chunks else linear
        self.quant = quant = ctx.quantization  # FP8 weights with scales per output row
        self.weight = nn.Parameter(torch.empty(output_size, input_size,
                                               dtype=FP8 if quant else None), requires_grad=False)
        self.weight.weight_loader = self._load_weight
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self._make_scales(output_size)
        # where the op before hands this layer its input quantized (layers/fp8_input.py): the
        # FP8Handoff it fills
        self.fp8_input = None
        # a hook that may compute this layer's GEMM instead (`take(x, part, x_fp8)`: the
        # output, or None), e.g. with SiLU-and-mul in the GEMV (layers/silu_gemv.py)
        self.gemm_hook = None
        # Weight layouts other plans use, by key (e.g. the shift plan's finer shard):
        # each a list of (weight, bias) parts whose outputs are concatenated. A layout
        # builder (parallel/shift_weights.py) makes them; the layer knows no plan.
        self.layouts: dict[str, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        # How each layout's output is laid out, by key: (blocks, widths) = `blocks` equal
        # blocks, each [segment 0 | segment 1 | ...] of those widths. Absent: the loaded
        # order, one block of output_segments()' widths.
        self.splits: dict[str, tuple[int, list[int]]] = {}

    def _make_scales(self, output_size: int) -> None:
        """An FP8 layer's scales: per output row (from the checkpoint, or made with the
        weight when it is quantized at load), and a static activation scale where the
        checkpoint has one."""
        quant = self.quant
        if quant is None:
            self.register_parameter("weight_scale", None)
            self.register_parameter("input_scale", None)
            return
        # NaN until loaded: a packed matrix whose checkpoint lacks one part's scale is caught
        self.weight_scale = nn.Parameter(torch.full((output_size, 1), math.nan, dtype=torch.float32),
                                         requires_grad=False)
        self.weight_scale.weight_loader = self._load_scale
        self.weight_scale.nan_until_loaded = True
        if not quant.serialized:  # filled by the weight's loader
            self.weight_scale.filled_by_weight = True
        if quant.static_activations:
            self.input_scale = nn.Parameter(torch.zeros(1, dtype=torch.float32),
                                            requires_grad=False)
            self.input_scale.weight_loader = _load_max
        else:
            self.register_parameter("input_scale", None)

    def part(self) -> WeightPart:
        """The loaded shard as one GEMM's weight."""
        return WeightPart(self.weight, self.bias, self.weight_scale)

    def rows(self, offset: int, size: int) -> WeightPart:
        return self.part().rows(offset, size)

    def columns(self, offset: int, size: int) -> WeightPart:
        return self.part().columns(offset, size)

    def _active_parts(self) -> list[WeightPart]:
        """This rank's weights under the active plan's layout."""
        key = get_context().weights
        if key == BASE_WEIGHTS:
            return [self.part()]
        if key not in self.layouts:
            raise RuntimeError(f"no weight layout {key!r}: it was not made at start-up")
        return self.layouts[key]

    def _gemm(self, x: torch.Tensor, part: WeightPart, x_fp8=None) -> torch.Tensor:
        fused = None if self.gemm_hook is None else self.gemm_hook.take(x, part, x_fp8)
        if fused is not None:
            return fused
        if part.scale is None:
            return self.matmul(x, part.weight, part.bias)
        return fp8_linear(x, part.weight, part.scale, part.bias, self.matmul, linear,
                          self.input_scale, x_fp8)

    def _fp8_rows(self, x: torch.Tensor):
        """x's rows in E4M3 and their scales where the op before made them with x, or None."""
        return None if self.fp8_input is None else self.fp8_input.take(x)

    def quantizes_input(self, rows: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this layer's GEMMs under the active layout would quantize an input of
        `rows` rows per token (fp8.quantizes_per_token)."""
        return any(quantizes_per_token(rows, dtype, device, part.weight, part.bias,
                                       self.matmul, linear) for part in self._active_parts())

    def set_layout(self, key: str, parts, separate: bool,
                   split: tuple[int, list[int]] | None = None) -> int:
        """Keeps a layout as views of the base shard or as one contiguous copy
        (separate), its output laid out as `split` (see `splits`); returns the bytes
        the copy takes. A part is a `WeightPart` (or a (weight, bias) pair)."""
        parts = [WeightPart(*p) for p in parts]
        if self.quant is not None and any(p.scale is None for p in parts):
            raise ValueError(f"weight layout {key!r} has FP8 weights without their scales "
                             "(this design does not run FP8 weights yet)")
        if separate:
            parts = [WeightPart.cat(parts)]
        self.layouts[key] = parts
        if split is not None:
            self.splits[key] = split
        return sum(t.nbytes for p in parts for t in p if t is not None) if separate else 0

    def output_segments(self) -> list[tuple[str, int, int]]:
        """(name, offset, size) of the segments of the loaded shard's output (dim 0 of the
        weight) in loading order: one for a plain matrix; q, k, v or the merged matrices."""
        return [("out", 0, self.weight.shape[0])]

    def output_split(self) -> tuple[int, list[int]]:
        """(blocks, widths) of the output under the active layout: `blocks` equal blocks,
        each the segments [w0 | w1 | ...] in order."""
        key = get_context().weights
        if key in self.splits:
            return self.splits[key]
        return 1, [size for _, _, size in self.output_segments()]

    def permute_rows(self, rows: list[tuple[int, int]], split: tuple[int, list[int]]) -> None:
        """Reorders the loaded shard's output rows (weight and bias, in place: the same
        storage) to the concatenation of the `rows` ranges (offset, size), which must be a
        permutation; the base output is then laid out as `split` (see `splits`). Done once
        after loading, before any layout view is taken and before CUDA graphs capture; the
        rows move cycle by cycle through a scratch buffer of one unit (the ranges' common
        divisor of rows), not through a copy of the shard."""
        if BASE_WEIGHTS in self.splits:
            raise RuntimeError("the shard's rows were reordered already")
        index = torch.cat([torch.arange(o, o + n) for o, n in rows])
        if index.numel() != self.weight.shape[0] or not torch.equal(
                index.sort().values, torch.arange(self.weight.shape[0])):
            raise ValueError("rows to reorder are not a permutation of the shard's rows")
        unit = math.gcd(*(n for _, n in rows))
        sources = [o // unit + k for o, n in rows for k in range(n // unit)]
        for param in (self.weight, self.bias, self.weight_scale):
            if param is not None:
                _permute_units(param.data, sources, unit)
        self.splits[BASE_WEIGHTS] = split

    def _shard(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        size = loaded.shape[dim] // self.tp_size
        return loaded.narrow(dim, self.tp_rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if self.tp_dim is not None and self.tp_size > 1 and loaded.dim() > self.tp_dim \
                and param.shape[self.tp_dim] != loaded.shape[self.tp_dim]:
            loaded = self._shard(loaded, self.tp_dim)  # (a row-parallel scale stays whole)
        param.data.copy_(as_tensor(loaded))

    def _load_weight(self, param, loaded, shard_id=None) -> None:
        """The weight's loader: an FP8 layer's weight is quantized here (its rows and their
        scales written together) unless the checkpoint holds it in FP8 already."""
        if param is self.weight and self.quant is not None:
            if self.quant.serialized:
                check_serialized(loaded)
            else:
                param = QuantizingTarget(self.weight.data, self.weight_scale.data)
        self.weight_loader(param, loaded, *(() if shard_id is None else (shard_id,)))

    def _load_scale(self, param, loaded, shard_id=None) -> None:
        """A checkpoint's scale, per row or one for the whole matrix (repeated per row)."""
        loaded = scale_rows(loaded, self._checkpoint_rows(shard_id))
        self.weight_loader(param, loaded, *(() if shard_id is None else (shard_id,)))

    def _checkpoint_rows(self, shard_id) -> int:
        """Rows of the checkpoint matrix loaded as `shard_id`."""
        return self.weight.shape[0] * (self.tp_size if self.tp_dim == 0 else 1)


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        tp_size = get_context().tp.size
        super().__init__(input_size, _divide(output_size, tp_size, "output size"), bias, tp_dim=0)

    def forward(self, x):
        parts, x_fp8 = self._active_parts(), self._fp8_rows(x)
        if len(parts) == 1:
            return self._gemm(x, parts[0], x_fp8)
        return torch.cat([self._gemm(x, part, x_fp8) for part in parts], dim=-1)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stored as one (gate_up)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def output_segments(self) -> list[tuple[str, int, int]]:
        sizes = [n // self.tp_size for n in self.output_sizes]
        return [(str(i), sum(sizes[:i]), size) for i, size in enumerate(sizes)]

    def _checkpoint_rows(self, shard_id) -> int:
        return self.output_sizes[shard_id or 0]

    def weight_loader(self, param, loaded, shard_id: int = 0):
        shard_size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, shard_size).copy_(as_tensor(self._shard(loaded, 0)))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matrix; each rank holds its heads of each.
    When the TP degree exceeds the KV heads, each KV head is replicated on
    tp_size / num_kv_heads consecutive ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False):
        tp_size = get_context().tp.size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size, "number of attention heads")
        if num_kv_heads >= tp_size:
            self.num_kv_heads = _divide(num_kv_heads, tp_size, "number of KV heads")
        else:
            _divide(tp_size, num_kv_heads, "TP degree over KV heads")
            self.num_kv_heads = 1
        self.total_num_kv_heads = num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, out, bias)

    def output_segments(self) -> list[tuple[str, int, int]]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [("q", 0, q_size), ("k", q_size, kv_size), ("v", q_size + kv_size, kv_size)]

    def kv_head_start(self) -> int:
        if self.total_num_kv_heads >= self.tp_size:
            return self.tp_rank * self.num_kv_heads
        return self.tp_rank // (self.tp_size // self.total_num_kv_heads)

    def _checkpoint_rows(self, shard_id) -> int:
        heads = self.num_heads * self.tp_size if shard_id in (None, "q") \
            else self.total_num_kv_heads
        return heads * self.head_dim

    def weight_loader(self, param, loaded, shard_id: str = "q"):
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, self.tp_rank * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, self.kv_head_start() * self.head_dim
        param.data.narrow(0, offset, size).copy_(as_tensor(loaded.narrow(0, start, size)))


class RowParallelLinear(LinearBase):
    """Input-sharded; partial sums are all-reduced over the TP group (in deterministic mode
    gathered and added in the canonical order, parashift/deterministic/reduction.py)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        tp_size = get_context().tp.size
        super().__init__(_divide(input_size, tp_size, "input size"), output_size, bias, tp_dim=1)

    def weight_loader(self, param, loaded, shard_id=None):
        if loaded.dim() == 1:  # bias: added once, after the reduction
            param.data.copy_(as_tensor(loaded))
            return
        if isinstance(param, QuantizingTarget):  # scales of whole rows, then the shard
            param.copy_sharded(as_tensor(loaded), self.tp_rank, self.tp_size)
            return
        super().weight_loader(param, loaded, shard_id)

    def forward(self, x):
        ctx = get_context()
        tp = ctx.tp
        part, x_fp8 = self._active_parts()[0], self._fp8_rows(x)
        if self.reduction_chunks:
            weight, bias, _ = part.dense(x.dtype)
            return row_parallel_linear(x, weight, bias, tp, self.reduction_chunks, ctx)
        if tp.rank != 0:
            part = part._replace(bias=None)
        return tp.all_reduce(self._gemm(x, part, x_fp8))
