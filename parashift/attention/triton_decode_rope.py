"""RoPE (with a model's q/k norms) and the KV write inside the one-launch decode kernel
(triton_decode.py's ROPE): what kernels/rotary.py's rotate_and_write_kv did before the launch,
in its arithmetic (kernels/rotary_values.py), so the rotated q, the pool's new key and value
and the attention's output are the bits of that kernel and the launch after it (under the
interpreter; on an H200 the output differed in its last bits: benchmarks/rope_fold_diag.py).

Each program rotates its group's q heads in registers and loads (and rotates) the new token's
key and value beside them; the one program of a (sequence, KV head) whose KV tiles hold the
new token (the sequence's last position) writes them to their slot, and a barrier orders
those stores before the program's own loads of the tile: no other program reads the slot
(the other splits' tiles end before it), so no ordering between programs is needed."""
import triton
import triton.language as tl

from parashift.kernels.rotary_values import rotated_heads


@triton.jit
def new_token_inputs(positions_ptr, cos_sin_ptr, slot_mapping_ptr, token, stride_cs,
                     HEAD_DIM: tl.constexpr):
    """(the token's slot, cos and sin of its position [1, HEAD_DIM // 2] in fp32): inputs no
    kernel of the step writes (loadable before the PDL wait)."""
    half: tl.constexpr = HEAD_DIM // 2
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    row = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cs
    dims = tl.arange(0, half)[None, :]
    cos = tl.load(row + dims).to(tl.float32)
    sin = tl.load(row + half + dims).to(tl.float32)
    return slot, cos, sin


@triton.jit
def rotated_q(q_rows, row_ok, cos, sin, q_norm_ptr, eps, dtype: tl.constexpr,
              HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr, MUL_RN: tl.constexpr):
    """The q heads at q_rows (pointers [R]; rows not `row_ok`: zeros) normed (QK_NORM),
    rotated and rounded to `dtype`: [R, HEAD_DIM], the halves side by side."""
    half: tl.constexpr = HEAD_DIM // 2
    y1, y2 = rotated_heads(q_rows, row_ok, cos, sin, q_norm_ptr, eps, half, half, QK_NORM,
                           MUL_RN)
    both = tl.permute(tl.join(y1.to(dtype), y2.to(dtype)), (0, 2, 1))  # [R, 2, half]
    return tl.reshape(both, (y1.shape[0], HEAD_DIM))


@triton.jit
def new_kv(k_row, v_row, slot, cos, sin, k_norm_ptr, eps, k_dtype: tl.constexpr,
           v_dtype: tl.constexpr, HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr,
           MUL_RN: tl.constexpr):
    """The new token's key (at k_row: normed, rotated, its halves [1, HEAD_DIM // 2] each) and
    value (at v_row, [1, HEAD_DIM]) in the pools' dtypes; zeros where slot is -1. Loaded beside
    q (one latency), stored by `store_new_kv` once the program knows it owns the slot."""
    half: tl.constexpr = HEAD_DIM // 2
    one = tl.arange(0, 1)
    ok = one + slot >= 0
    y1, y2 = rotated_heads(k_row + one, ok, cos, sin, k_norm_ptr, eps, half, half, QK_NORM,
                           MUL_RN)
    full = tl.arange(0, HEAD_DIM)[None, :]
    v = tl.load((v_row + one)[:, None] + full, mask=ok[:, None] & (full < HEAD_DIM), other=0.0)
    return y1.to(k_dtype), y2.to(k_dtype), v.to(v_dtype)


@triton.jit
def store_new_kv(k_cache_ptr, v_cache_ptr, slot, kv_head, k1, k2, v, stride_kb, stride_ks,
                 stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE: tl.constexpr,
                 HEAD_DIM: tl.constexpr):
    """`new_kv`'s key halves and value into KV head kv_head's row of the slot (-1: none)."""
    half: tl.constexpr = HEAD_DIM // 2
    one = tl.arange(0, 1)
    ok = (one + slot >= 0)[:, None]
    at = tl.maximum(slot, 0)
    block, in_block = at // BLOCK_SIZE, at % BLOCK_SIZE
    dims = tl.arange(0, half)[None, :]
    k_dst = (k_cache_ptr + block * stride_kb + in_block * stride_ks + kv_head * stride_kh
             + one)[:, None] + dims
    tl.store(k_dst, k1, mask=ok & (dims < half))
    tl.store(k_dst + half, k2, mask=ok & (dims < half))
    full = tl.arange(0, HEAD_DIM)[None, :]
    v_dst = (v_cache_ptr + block * stride_vb + in_block * stride_vs + kv_head * stride_vh
             + one)[:, None] + full
    tl.store(v_dst, v, mask=ok & (full < HEAD_DIM))
