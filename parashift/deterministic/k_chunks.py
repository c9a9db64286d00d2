"""How K is cut into chunks for a contraction that no plan splits (the column-parallel
projections, the LM head): what `matmul.py` sums in order and `triton_matmul.py` may spread
over programs."""

# at most this many chunks, each of whole 64-wide tiles
MAX_K_CHUNKS = 8
K_TILE = 64
# ... and from this K on only: on an H200, spreading a product's chunks over programs paid
# for K of 14,336 at up to 128 rows, never for K of 4,096 (twelfth session); below it one chunk
# (one MMA chain, no fold of chunk totals) took the 8B shape's qkv, gate_up and LM head 6-11%
# less time at 256 rows and 13-16% less at 4,096, the same at 1 and 64 rows (thirtieth session)
SPREAD_MIN_K = 8192


def column_chunks(k: int) -> int:
    """The K chunks of a contraction that no plan splits (column-parallel projections, the
    LM head): a function of K alone, so every batch and plan sums the same chunks. From
    SPREAD_MIN_K, more than one lets a decode's few output tiles spread over the device
    (`triton_matmul`); below, one."""
    if k < SPREAD_MIN_K:
        return 1
    return next((c for c in range(MAX_K_CHUNKS, 1, -1) if k % (c * K_TILE) == 0), 1)
