"""Decode attention's KV tiles over an FP8 pool, the values read as pairs.

The weighted sum of a tile's values, p @ v, takes v as the tensor cores' second operand: a
thread holds consecutive tokens of one dimension, and the pool holds a token's dimensions
contiguous. For 16-bit values a transposing shared-memory load (ldmatrix.trans) gathers them;
for 8-bit ones there is none, and Triton reads them one byte at a time (on an H200, 8B heads,
batch 64, context 1,040: 91.5 µs a layer for half the bytes of bf16's 69.7). The one-launch
kernel (triton_decode.py) and the preloading split kernel (triton_decode_preload.py, its
first tile's pairs loaded before its PDL wait) take this path under FP8_PAIRS. Here the values
are loaded as 16-bit pairs of adjacent dimensions (transposed by ldmatrix as bf16 is), each
pair split into its even and its odd dimension in registers, and p @ v runs as two products of
half the width, kept in two accumulators until the end (`joined`). The keys, q @ k^T's second
operand, already hold a thread's dimensions contiguous: they load as before.

Not batch-invariant: deterministic mode keeps `triton_kernels`' fixed partitions."""
import triton
import triton.language as tl


@triton.jit
def _halves(pairs, fp8_type: tl.constexpr, dtype: tl.constexpr):
    """The even and odd dimensions of 16-bit pairs of FP8 values, in dtype."""
    even = (pairs & 0xFF).to(tl.uint8).to(fp8_type, bitcast=True).to(dtype)
    odd = ((pairs >> 8) & 0xFF).to(tl.uint8).to(fp8_type, bitcast=True).to(dtype)
    return even, odd


@triton.jit
def attend_pairs(acc_even, acc_odd, m_i, l_i, q, k, pairs, n_ok, pos, q_pos, qk_scale,
                 fp8_type: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over one tile: k [TILE_N, HEAD_DIM] in FP8, pairs [TILE_N, HEAD_DIM // 2]
    its values' 16-bit pairs; MASKED: keys past q_pos or where n_ok is false left out."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where((pos[None, :] <= q_pos[:, None]) & n_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_even, v_odd = _halves(pairs, fp8_type, q.dtype)
    weights = p.to(q.dtype)
    acc_even = acc_even * alpha[:, None] + tl.dot(weights, v_even, input_precision=DOT_PRECISION)
    acc_odd = acc_odd * alpha[:, None] + tl.dot(weights, v_odd, input_precision=DOT_PRECISION)
    return acc_even, acc_odd, m_new, l_i


@triton.jit
def pair_rows(v_rows):
    """Pointers to the 16-bit pairs of FP8 value rows at v_rows."""
    return v_rows.to(tl.pointer_type(tl.int16))


@triton.jit
def attend_tiles_fp8(acc_even, acc_odd, m_i, l_i, q, k_base, v_base, block_table_ptr,
                     tile_lo, tile_hi, kv_end, q_pos, qk_scale,
                     stride_kb, stride_ks, stride_vb, stride_vs,
                     MASKED: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """`triton_kernels._attend_tiles` over FP8 K and V (HEAD_DIM a power of two of at least
    32), the weighted values summed into acc_even / acc_odd ([rows, HEAD_DIM // 2]: the even
    and the odd dimensions)."""
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_pair = tl.arange(0, HEAD_DIM // 2)
    for tile in range(tile_lo, tile_hi):
        pos = tile * TILE_N + offs_n
        n_ok = pos < kv_end
        if MASKED:
            block = tl.load(block_table_ptr + pos // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        else:
            block = tl.load(block_table_ptr + pos // BLOCK_SIZE).to(tl.int64)
        in_block = pos % BLOCK_SIZE
        k_rows = k_base + block * stride_kb + in_block * stride_ks
        v_rows = pair_rows(v_base + block * stride_vb + in_block * stride_vs)
        if MASKED:
            k = tl.load(k_rows[:, None] + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            pairs = tl.load(v_rows[:, None] + offs_pair[None, :], mask=n_ok[:, None], other=0)
        else:
            k = tl.load(k_rows[:, None] + offs_d[None, :])
            pairs = tl.load(v_rows[:, None] + offs_pair[None, :])
        acc_even, acc_odd, m_i, l_i = attend_pairs(acc_even, acc_odd, m_i, l_i, q, k, pairs,
                                                   n_ok, pos, q_pos, qk_scale,
                                                   v_base.dtype.element_ty, MASKED,
                                                   DOT_PRECISION)
    return acc_even, acc_odd, m_i, l_i


@triton.jit
def joined(acc_even, acc_odd, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """[ROWS, HEAD_DIM]: the even and odd dimensions' accumulators interleaved."""
    return tl.reshape(tl.join(acc_even, acc_odd), [ROWS, HEAD_DIM])


@triton.jit
def zero_halves(ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Empty even and odd accumulators."""
    return (tl.zeros([ROWS, HEAD_DIM // 2], dtype=tl.float32),
            tl.zeros([ROWS, HEAD_DIM // 2], dtype=tl.float32))
