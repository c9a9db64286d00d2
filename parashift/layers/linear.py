"""Linear layers sharded over the active plan's TP group.

Each parameter carries a `weight_loader(param, loaded_weight, shard_id)` that
copies this rank's slice of a full (unsharded) checkpoint tensor."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from parashift.deterministic import matmul as invariant
from parashift.deterministic.reduction import row_parallel_linear
from parashift.kernels import use_triton
from parashift.lazy_tensor import as_tensor
from parashift.context import BASE_WEIGHTS, get_context


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel degree {d}")
    return n // d


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if use_triton(x):
        from parashift.kernels import skinny_gemm
        return skinny_gemm.linear(x, weight, bias)
    return F.linear(x, weight, bias)


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
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        # Weight layouts other plans use, by key (e.g. the shift plan's finer shard):
        # each a list of (weight, bias) parts whose outputs are concatenated. A layout
        # builder (parallel/shift_weights.py) makes them; the layer knows no plan.
        self.layouts: dict[str, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        # How each layout's output is laid out, by key: (blocks, widths) = `blocks` equal
        # blocks, each [segment 0 | segment 1 | ...] of those widths. Absent: the loaded
        # order, one block of output_segments()' widths.
        self.splits: dict[str, tuple[int, list[int]]] = {}

    def _active_parts(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """This rank's weights under the active plan's layout."""
        key = get_context().weights
        if key == BASE_WEIGHTS:
            return [(self.weight, self.bias)]
        if key not in self.layouts:
            raise RuntimeError(f"no weight layout {key!r}: it was not made at start-up")
        return self.layouts[key]

    def set_layout(self, key: str, parts, separate: bool,
                   split: tuple[int, list[int]] | None = None) -> int:
        """Keeps a layout as views of the base shard or as one contiguous copy
        (separate), its output laid out as `split` (see `splits`); returns the bytes
        the copy takes."""
        if separate:
            weight = torch.cat([w for w, _ in parts]).contiguous()
            bias = torch.cat([b for _, b in parts]) if parts[0][1] is not None else None
            parts = [(weight, bias)]
        self.layouts[key] = parts
        if split is not None:
            self.splits[key] = split
        return sum(w.nbytes + (b.nbytes if b is not None else 0) for w, b in parts) if separate else 0

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
        for param in (self.weight, self.bias):
            if param is not None:
                _permute_units(param.data, sources, unit)
        self.splits[BASE_WEIGHTS] = split

    def _shard(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        size = loaded.shape[dim] // self.tp_size
        return loaded.narrow(dim, self.tp_rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if self.tp_dim is not None and self.tp_size > 1 and loaded.dim() > self.tp_dim:
            loaded = self._shard(loaded, self.tp_dim)
        param.data.copy_(as_tensor(loaded))


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        tp_size = get_context().tp.size
        super().__init__(input_size, _divide(output_size, tp_size, "output size"), bias, tp_dim=0)

    def forward(self, x):
        parts = self._active_parts()
        if len(parts) == 1:
            return self.matmul(x, *parts[0])
        return torch.cat([self.matmul(x, w, b) for w, b in parts], dim=-1)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stored as one (gate_up)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def output_segments(self) -> list[tuple[str, int, int]]:
        sizes = [n // self.tp_size for n in self.output_sizes]
        return [(str(i), sum(sizes[:i]), size) for i, size in enumerate(sizes)]

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

    def _kv_head_start(self) -> int:
        if self.total_num_kv_heads >= self.tp_size:
            return self.tp_rank * self.num_kv_heads
        return self.tp_rank // (self.tp_size // self.total_num_kv_heads)

    def weight_loader(self, param, loaded, shard_id: str = "q"):
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, self.tp_rank * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, self._kv_head_start() * self.head_dim
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
        super().weight_loader(param, loaded, shard_id)

    def forward(self, x):
        ctx = get_context()
        tp = ctx.tp
        weight, bias = self._active_parts()[0]
        if self.reduction_chunks:
            return row_parallel_linear(x, weight, bias, tp, self.reduction_chunks, ctx)
        y = linear(x, weight, bias if tp.rank == 0 else None)
        return tp.all_reduce(y)
