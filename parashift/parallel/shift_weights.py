"""Shift Parallelism's weights for the shift plan (TP over SP_TP): each rank's
shard is its SP rank's slice of its base (SP, TP) shard.

For a column-parallel layer the slice is, segment by segment, the SP rank's rows of
each segment (q heads and the KV heads they use; gate and up); for a row-parallel one
its SP rank's input columns (one strided view). Modes:
- `reorder` (default): after loading, the rows of every fused column-parallel shard are
  permuted so that each SP rank's shift rows are one contiguous block,
  [q|k|v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] and [gate|up] -> [gate_0 up_0 | gate_1 up_1 | ...].
  The shift layout is then one view of the base weight: one GEMM per projection under
  both plans and no extra memory. The base plan's output comes out in that block order;
  the layer says so (`output_split()`: SP blocks), and the model reads q/k/v and
  gate/up from it.
- `slice`: views of the base shard in loading order; a fused projection's shift slice is
  several row ranges, run as several GEMMs and a cat.
- `separate`: one contiguous copy of the slice (extra memory w / (SP x TP) per rank, the
  paper's choice).

Layers are found by duck typing (this folder does not import `layers`): a parallel
linear layer has `tp_dim` (0: output rows sharded, 1: input columns), `output_segments()`,
`set_layout()` and `permute_rows()`; the q/k/v one also has `num_heads`, `num_kv_heads`
and `head_dim`."""
import logging

from torch import nn

from parashift.parallel.ulysses import kv_heads_for_block

logger = logging.getLogger(__name__)
SHIFT_WEIGHT_MODES = ("reorder", "slice", "separate")
SHIFT_WEIGHTS = "shift"  # the layout key of the shift plan's weights

Rows = list[tuple[int, int]]  # (offset, size) ranges of a shard's output rows


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} = {n} is not divisible by the sequence-parallel degree {d}")
    return n // d


def shift_rows(layer, sp_size: int, sp_rank: int) -> Rows:
    """The rows of a column-parallel layer's loaded shard that SP rank `sp_rank` holds
    under the shift plan, one range per output segment, in segment order."""
    segments = layer.output_segments()
    if [name for name, _, _ in segments] == ["q", "k", "v"]:
        # attention: an even share of the q heads, and the KV heads those heads use
        d = layer.head_dim
        heads = _divide(layer.num_heads, sp_size, "heads per rank")
        kv = kv_heads_for_block(sp_rank, sp_size, layer.num_heads, layer.num_kv_heads)
        (_, q0, _), (_, k0, _), (_, v0, _) = segments
        return [(q0 + sp_rank * heads * d, heads * d),
                (k0 + kv[0] * d, len(kv) * d), (v0 + kv[0] * d, len(kv) * d)]
    rows = []
    for _, offset, size in segments:
        step = _divide(size, sp_size, "shard rows")
        rows.append((offset + sp_rank * step, step))
    return rows


def _views(layer, rows: Rows):
    return [(layer.weight.narrow(0, o, n),
             layer.bias.narrow(0, o, n) if layer.bias is not None else None) for o, n in rows]


def reorder_rows(layer, sp_size: int) -> Rows | None:
    """The permutation of a column-parallel shard's rows that makes each SP rank's shift
    rows contiguous (SP rank s's block s), or None where the blocks share rows: when SP
    exceeds this TP rank's KV heads, several SP ranks use one KV head (the base plan
    replicates it before the all-to-all, `kv_heads_for_block`), so no permutation makes
    every block contiguous. Such a layer falls back to `slice` (views, 3 GEMMs under the
    shift plan, no extra bytes) rather than duplicating its k/v rows in the base weight."""
    blocks = [shift_rows(layer, sp_size, s) for s in range(sp_size)]
    flat = [r for block in blocks for r in block]
    if sum(n for _, n in flat) != layer.weight.shape[0]:
        return None
    covered = sorted(flat)
    end = 0
    for offset, size in covered:
        if offset != end:
            return None
        end += size
    return flat


def reorder_inverse(rows: Rows) -> Rows:
    """The ranges that undo `rows` (a permutation): loaded row r sits at the returned order."""
    placed, at = [], 0
    for offset, size in rows:
        placed.append((offset, at, size))
        at += size
    return [(at_, size) for _, at_, size in sorted(placed)]


def make_layer_shift_weights(layer, sp_size: int, sp_rank: int, mode: str,
                             key: str = SHIFT_WEIGHTS) -> tuple[int, str]:
    """Gives one parallel linear layer its shift layout (under `key`); returns (extra bytes,
    the mode used: `reorder` falls back to `slice` where it cannot apply)."""
    if layer.tp_dim == 1:  # row-parallel: this SP rank's input columns, one strided view
        step = _divide(layer.weight.shape[1], sp_size, "shard columns")
        parts = [(layer.weight.narrow(1, sp_rank * step, step), layer.bias)]
        return layer.set_layout(key, parts, mode == "separate"), mode
    rows = shift_rows(layer, sp_size, sp_rank)
    widths = [n for _, n in rows]
    if mode == "reorder" and len(rows) > 1:
        order = reorder_rows(layer, sp_size)
        if order is None:
            mode = "slice"
        else:
            layer.permute_rows(order, (sp_size, widths))
            block = sum(widths)
            layer.set_layout(key, _views(layer, [(sp_rank * block, block)]), False,
                             (1, widths))
            return 0, mode
    if mode == "reorder":  # one segment: its slice is already one contiguous view
        mode = "slice"
    return layer.set_layout(key, _views(layer, rows), mode == "separate",
                            (1, widths)), mode


def make_shift_weights(model: nn.Module, sp_size: int, sp_rank: int, mode: str,
                       report: bool = True, key: str = SHIFT_WEIGHTS) -> int:
    """Gives every parallel linear layer its shift layout under `key`; returns the extra
    bytes. Runs once after loading and before CUDA graphs are captured (graphs capture each
    plan's views; the layout must not change afterwards). A merged plan (Flying Serving)
    uses the same slicing: its w replicas' full weights play the SP ranks' copies."""
    if mode not in SHIFT_WEIGHT_MODES:
        raise ValueError(f"shift weights must be one of {SHIFT_WEIGHT_MODES}, got {mode!r}")
    extra, fallback = 0, []
    for name, module in model.named_modules():
        if getattr(module, "tp_dim", None) is None or not hasattr(module, "set_layout"):
            continue
        nbytes, used = make_layer_shift_weights(module, sp_size, sp_rank, mode, key)
        extra += nbytes
        if mode == "reorder" and used != "reorder" and module.tp_dim == 0 \
                and len(module.output_segments()) > 1:
            fallback.append(name)
    base = sum(p.nbytes for p in model.parameters())
    if report:
        logger.warning("%s weights (%s): base shard %.2f GiB, its 1/%d slice adds %.2f GiB per "
                       "rank", key, mode, base / 2**30, sp_size, extra / 2**30)
        if fallback:
            logger.warning("shift weights (reorder): %d layers share KV heads between SP ranks "
                           "and keep slice views (one GEMM per segment under the shift plan), "
                           "e.g. %s", len(fallback), fallback[0])
    return extra
