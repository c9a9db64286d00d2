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
def new_kv(k_token, v_row, kv_head, num_kv_heads, stride_knh, slot, cos, sin, k_norm_ptr, eps,
           k_dtype: tl.constexpr, v_dtype: tl.constexpr, HEAD_DIM: tl.constexpr,
           K_HEADS_P: tl.constexpr, QK_NORM: tl.constexpr, MUL_RN: tl.constexpr):
    """The new token's key (its heads at k_token, stride_knh apart: normed, rotated) as halves
    [rows, HEAD_DIM // 2] with the KV head of each row, and its value (at v_row, [1, HEAD_DIM])
    in the pools' dtypes; zeros where slot is -1. Loaded beside q (one latency), stored by
    `store_new_kv` once the program knows it owns the slot. The key's rows: KV head kv_head
    alone, or with QK_NORM every KV head ([K_HEADS_P, HEAD_DIM // 2], as kernels/rotary.py
    holds them): each head's sum of squares then takes the rotary kernel's layout, so its
    order and bits."""
    half: tl.constexpr = HEAD_DIM // 2
    one = tl.arange(0, 1)
    if QK_NORM:
        heads = tl.arange(0, K_HEADS_P)
        ok = (heads < num_kv_heads) & (heads * 0 + slot >= 0)
    else:
        heads = one + kv_head
        ok = one + slot >= 0
    y1, y2 = rotated_heads(k_token + heads * stride_knh, ok, cos, sin, k_norm_ptr, eps, half,
                           half, QK_NORM, MUL_RN)
    full = tl.arange(0, HEAD_DIM)[None, :]
    v_ok = (one + slot >= 0)[:, None] & (full < HEAD_DIM)
    v = tl.load((v_row + one)[:, None] + full, mask=v_ok, other=0.0)
    return heads, y1.to(k_dtype), y2.to(k_dtype), v.to(v_dtype)


@triton.jit
def store_new_kv(k_cache_ptr, v_cache_ptr, slot, kv_head, heads, k1, k2, v, stride_kb,
                 stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                 BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """`new_kv`'s key halves (the row of KV head kv_head among `heads`) and value into that
    head's row of the slot (-1: none)."""
    half: tl.constexpr = HEAD_DIM // 2
    one = tl.arange(0, 1)
    at = tl.maximum(slot, 0)
    block, in_block = at // BLOCK_SIZE, at % BLOCK_SIZE
    dims = tl.arange(0, half)[None, :]
    k_ok = ((heads == kv_head) & (heads * 0 + slot >= 0))[:, None] & (dims < half)
    k_dst = (k_cache_ptr + block * stride_kb + in_block * stride_ks
             + heads * stride_kh)[:, None] + dims
    tl.store(k_dst, k1, mask=k_ok)
    tl.store(k_dst + half, k2, mask=k_ok)
    full = tl.arange(0, HEAD_DIM)[None, :]
    v_dst = (v_cache_ptr + block * stride_vb + in_block * stride_vs + kv_head * stride_vh
             + one)[:, None] + full
    tl.store(v_dst, v, mask=(one + slot >= 0)[:, None] & (full < HEAD_DIM))
