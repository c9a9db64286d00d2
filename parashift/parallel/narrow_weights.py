"""The narrowed weight layouts a rank's plans use, made once after loading and before CUDA
graphs capture: Shift's shift plan (each rank's 1/SP slice of its base shard) and Flying
Serving's merged plans (each rank's 1/w slice of its full replica, one layout per width).
A layout is a `Narrowing`: the position-th of `factor` equal slices of every segment of the
loaded shard (`shift_weights.shift_rows`), kept in one of three modes:
- `view`: views of the loaded rows; a fused projection's slice is several row ranges, run
  as several GEMMs and a cat (no extra memory).
- `materialize`: one contiguous copy of the slice (extra memory 1/factor of the shard).
- `reorder`: the rows of every fused column-parallel shard are permuted in place, once, so
  that each slice is one contiguous block: one GEMM per projection, no extra memory.

Nested reorder: one permutation serves every reorder width whose slices nest. The rows are
laid out in the finest width W's blocks, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] and
[gate_0 up_0 | gate_1 up_1 | ...]; the slice of width w | W at position p is then the run
of blocks p·W/w .. (p+1)·W/w - 1, one view, whose output the layer reports as W/w blocks
(`output_split()`), as the base plan's output is W blocks. A width that does not divide W
(2 and 3 on one rank), or a layer where W's blocks would share KV rows
(`shift_weights.reorder_rows` is None), keeps `view` there: its rows are looked up through
the permutation. The permutation is made at load and never undone: a merge or a split
moves no byte, so every plan reads the same resident rows.

Layers are found by duck typing (this folder does not import `layers`): a parallel
linear layer has `tp_dim` (0: output rows sharded, 1: input columns), `output_segments()`,
`rows()` and `columns()` (its weight parts: weight, bias and an FP8 weight's scales, sliced
together), `set_layout()` and `permute_rows()`."""
import logging
from dataclasses import dataclass

from torch import nn

from parashift.parallel.shift_weights import Rows, divide, reorder_rows, shift_rows

logger = logging.getLogger(__name__)
WEIGHT_MODES = ("view", "materialize", "reorder")
# --shift-weights keeps its first names for the same three modes
SHIFT_MODE_NAMES = {"reorder": "reorder", "slice": "view", "separate": "materialize"}


@dataclass(frozen=True)
class Narrowing:
    """A layout: the `position`-th 1/`factor` slice of the loaded shard, kept as `mode`."""
    factor: int
    position: int
    mode: str

    def __post_init__(self):
        if self.mode not in WEIGHT_MODES:
            raise ValueError(f"weight layout mode must be one of {WEIGHT_MODES}, got {self.mode!r}")
        if not 0 <= self.position < self.factor:
            raise ValueError(f"slice {self.position} of {self.factor} does not exist")


def _views(layer, rows: Rows):
    """The layer's weight parts (weight, bias, FP8 scales) of the row ranges."""
    return [layer.rows(o, n) for o, n in rows]


def moved_rows(rows: Rows, order: Rows | None) -> Rows:
    """Where the loaded rows `rows` sit once the shard is permuted to `order` (the loaded
    ranges in their new order), as ranges in the order of `rows`, adjacent ones joined."""
    if order is None:
        return rows
    out, starts, at = [], [], 0
    for offset, size in order:
        starts.append(at)
        at += size
    for lo, n in rows:
        pieces = sorted((max(lo, o), min(lo + n, o + size) - max(lo, o), start - o)
                        for (o, size), start in zip(order, starts)
                        if max(lo, o) < min(lo + n, o + size))
        for first, count, shift in pieces:
            if out and out[-1][0] + out[-1][1] == first + shift:
                out[-1] = (out[-1][0], out[-1][1] + count)
            else:
                out.append((first + shift, count))
    return out


def _finest_width(layer, factors: set[int]) -> tuple[int | None, Rows | None]:
    """The width whose blocks the layer's rows are laid out in, and that permutation: the one
    serving the most reorder widths (those dividing it), the finer on a tie; (None, None)
    where no permutation helps (one segment: every slice is one range already)."""
    if len(layer.output_segments()) < 2:
        return None, None
    ranked = sorted(factors, key=lambda w: (sum(w % f == 0 for f in factors), w), reverse=True)
    for width in ranked:
        order = reorder_rows(layer, width)
        if order is not None:
            return width, order
    return None, None


def _reorder_widths(needs: dict[str, Narrowing]) -> set[int]:
    return {need.factor for need in needs.values() if need.mode == "reorder"}


def make_layer_layouts(layer, needs: dict[str, Narrowing]) -> tuple[int, dict[str, str]]:
    """Gives one parallel linear layer every layout in `needs` (by key); returns (extra
    bytes, the mode each key got: a reorder the layer cannot serve is a view)."""
    if layer.tp_dim == 1:  # row-parallel: the slice's input columns, one strided view
        extra = 0
        for key, need in needs.items():
            step = divide(layer.weight.shape[1], need.factor, "shard columns")
            parts = [layer.columns(need.position * step, step)]
            extra += layer.set_layout(key, parts, need.mode == "materialize")
        return extra, {key: need.mode for key, need in needs.items()}
    finest, order = _finest_width(layer, _reorder_widths(needs))
    if order is not None:
        block_widths = [n for _, n in shift_rows(layer, finest, 0)]
        layer.permute_rows(order, (finest, block_widths))
        block = sum(block_widths)
    extra, used = 0, {}
    for key, need in needs.items():
        if need.mode == "reorder" and order is not None and finest % need.factor == 0:
            run = finest // need.factor
            view = _views(layer, [(need.position * run * block, run * block)])
            layer.set_layout(key, view, False, (run, block_widths))
            used[key] = "reorder"
            continue
        rows = shift_rows(layer, need.factor, need.position)
        parts = _views(layer, moved_rows(rows, order))
        extra += layer.set_layout(key, parts, need.mode == "materialize",
                                  (1, [n for _, n in rows]))
        used[key] = "materialize" if need.mode == "materialize" else "view"
    return extra, used


def make_narrow_weights(model: nn.Module, needs: dict[str, Narrowing], report: bool = True) -> int:
    """Gives every parallel linear layer of `model` the layouts in `needs` (by key); returns
    the extra bytes. Logs (once) the reorder layouts that some fused layers keep as views."""
    extra, fallback = 0, {}
    for name, module in model.named_modules():
        if hasattr(module, "make_narrowed_layout"):  # stacked experts: views in every mode
            for key, need in needs.items():
                module.make_narrowed_layout(key, need.factor, need.position)
            continue
        if getattr(module, "tp_dim", None) is None or not hasattr(module, "set_layout"):
            continue
        nbytes, used = make_layer_layouts(module, needs)
        extra += nbytes
        if module.tp_dim == 0 and len(module.output_segments()) > 1:
            for key, mode in used.items():
                if needs[key].mode == "reorder" and mode != "reorder":
                    fallback.setdefault(key, []).append(name)
    if report and needs:
        base = sum(p.nbytes for p in model.parameters())
        logger.warning("narrowed weight layouts %s: base shard %.2f GiB, they add %.2f GiB per "
                       "rank", {k: f"1/{n.factor} {n.mode}" for k, n in needs.items()},
                       base / 2**30, extra / 2**30)
    if report and fallback:
        logger.warning("reorder asked for widths %s on this rank; these layouts keep views (one "
                       "GEMM per segment) in the fused layers named (their width does not nest "
                       "in the finest reorder width, or its blocks share KV heads): %s",
                       sorted(_reorder_widths(needs)),
                       {key: f"{len(names)} layers, e.g. {names[0]}"
                        for key, names in fallback.items()})
    return extra
