"""The rows of a narrowed weight layout: the position-th 1/factor slice of a rank's loaded
shard, as used by Shift Parallelism's shift plan (TP over SP_TP: each rank's shard is its SP
rank's slice of its base (SP, TP) shard) and by Flying Serving's merged plans (each rank's
1/w slice of its replica); `narrow_weights.py` builds the layouts from them.

For a column-parallel layer the slice is, segment by segment, the slice's rows of each
segment (q heads and the KV heads they use; gate and up); for a row-parallel one its input
columns (one strided view). The q/k/v layer has `num_heads`, `num_kv_heads` and
`head_dim` besides `output_segments()`."""
from parashift.parallel.ulysses import kv_heads_for_block

SHIFT_WEIGHTS = "shift"  # the layout key of the shift plan's weights

Rows = list[tuple[int, int]]  # (offset, size) ranges of a shard's output rows


def divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} = {n} is not divisible by the narrowing factor {d}")
    return n // d


def shift_rows(layer, sp_size: int, sp_rank: int) -> Rows:
    """The rows of a column-parallel layer's loaded shard that SP rank `sp_rank` holds
    under the shift plan, one range per output segment, in segment order."""
    segments = layer.output_segments()
    if [name for name, _, _ in segments] == ["q", "k", "v"]:
        # attention: an even share of the q heads, and the KV heads those heads use
        d = layer.head_dim
        heads = divide(layer.num_heads, sp_size, "heads per rank")
        kv = kv_heads_for_block(sp_rank, sp_size, layer.num_heads, layer.num_kv_heads)
        (_, q0, _), (_, k0, _), (_, v0, _) = segments
        return [(q0 + sp_rank * heads * d, heads * d),
                (k0 + kv[0] * d, len(kv) * d), (v0 + kv[0] * d, len(kv) * d)]
    rows = []
    for _, offset, size in segments:
        step = divide(size, sp_size, "shard rows")
        rows.append((offset + sp_rank * step, step))
    return rows


def reorder_rows(layer, sp_size: int) -> Rows | None:
    """The permutation of a column-parallel shard's rows that makes each of its `sp_size`
    slices contiguous (slice s is block s), or None where the slices share rows: when
    `sp_size` exceeds this rank's KV heads, several slices use one KV head (Shift's base
    plan replicates it before the all-to-all, `kv_heads_for_block`), so no permutation
    makes every block contiguous. Such a layer keeps views (3 GEMMs under the narrowed
    plan, no extra bytes) rather than duplicating its k/v rows in the base weight."""
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
