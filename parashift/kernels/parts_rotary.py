"""The RoPE + KV-write kernel that finishes a split-K QKV GEMM's sum (issue 61: decode at
33-64 rows). A parts-out GEMM (dense_gemm_tma.tma_parts, fp8_gemm_tma.tma_parts) stores each
part of K unscaled, fp32, with no tickets; this kernel's program for a token sums the token's
q, k and v columns of the parts in part order (split_tickets.summed_parts), scales them by the
weight rows' scales and the token's scale (FP8), rounds them to the activations' dtype (what
the ticket path's last program stores, fp8_epilogue.finish_tile), then rotates q and k and
writes k and v to their slots as kernels/rotary.py's kernel does (its arithmetic, no FP
fusion: the same bits). The QKV output's columns are [q heads | k heads | v heads], each head
head_dim wide; no q/k norms."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets
from parashift.kernels.rotary import cos_sin_of, store_halves
from parashift.kernels.rotary_values import rotated_halves


@triton.jit
def _finished(row_ptr, plane, cols, mask, ws_ptr, x_scale, PARTS: tl.constexpr,
              W_SCALED: tl.constexpr, X_SCALED: tl.constexpr, dtype: tl.constexpr):
    """The GEMM's outputs at the token's columns `cols`, rounded to `dtype`."""
    total = split_tickets.summed_parts(row_ptr + cols, plane, mask, PARTS)
    if W_SCALED:
        total *= tl.load(ws_ptr + cols, mask=mask, other=0.0)
    if X_SCALED:
        total *= x_scale
    return total.to(dtype)


@triton.jit
def _rotate_part_heads(dst_ptr, dst_stride_h, row_ptr, plane, first_col, num_heads, cos, sin,
                       ws_ptr, x_scale, HALF: tl.constexpr, HEADS_P: tl.constexpr,
                       HALF_P: tl.constexpr, PARTS: tl.constexpr, W_SCALED: tl.constexpr,
                       X_SCALED: tl.constexpr, dtype: tl.constexpr):
    heads = tl.arange(0, HEADS_P)
    ok = heads < num_heads
    dims = tl.arange(0, HALF_P)[None, :]
    mask = ok[:, None] & (dims < HALF)
    cols = first_col + heads[:, None] * (2 * HALF) + dims
    x1 = _finished(row_ptr, plane, cols, mask, ws_ptr, x_scale, PARTS, W_SCALED, X_SCALED,
                   dtype).to(tl.float32)
    x2 = _finished(row_ptr, plane, cols + HALF, mask, ws_ptr, x_scale, PARTS, W_SCALED,
                   X_SCALED, dtype).to(tl.float32)
    y1, y2 = rotated_halves(x1, x2, cos, sin)
    store_halves(dst_ptr, dst_stride_h, heads, ok, y1, y2, HALF, HALF_P)


@triton.jit
def _parts_rotary_kernel(q_out_ptr, k_cache_ptr, v_cache_ptr, part_ptr, ws_ptr, xs_ptr,
                         positions_ptr, cos_sin_ptr, slot_mapping_ptr, plane, stride_cs,
                         num_q_heads, num_k_heads, stride_kcb, stride_kcs, stride_kch,
                         stride_vcb, stride_vcs, stride_vch,
                         N: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr,
                         Q_HEADS_P: tl.constexpr, K_HEADS_P: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, PARTS: tl.constexpr,
                         W_SCALED: tl.constexpr, X_SCALED: tl.constexpr,
                         USE_PDL: tl.constexpr, EARLY_LOADS: tl.constexpr = True):
    if not EARLY_LOADS:
        pdl.start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = cos_sin_of(positions_ptr, cos_sin_ptr, token, stride_cs, HALF, HALF_P)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if EARLY_LOADS:
        pdl.start(USE_PDL)
    dtype = q_out_ptr.dtype.element_ty
    row_ptr = part_ptr + token * N
    x_scale = 1.0
    if X_SCALED:
        x_scale = tl.load(xs_ptr + token)
    _rotate_part_heads(q_out_ptr + token * num_q_heads * 2 * HALF, 2 * HALF, row_ptr, plane,
                       0, num_q_heads, cos, sin, ws_ptr, x_scale, HALF, Q_HEADS_P, HALF_P,
                       PARTS, W_SCALED, X_SCALED, dtype)
    heads_written = tl.where(slot >= 0, num_k_heads, 0)  # slot -1: a padding row
    slot = tl.maximum(slot, 0)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    _rotate_part_heads(k_cache_ptr + block * stride_kcb + offset * stride_kcs, stride_kch,
                       row_ptr, plane, num_q_heads * 2 * HALF, heads_written, cos, sin, ws_ptr,
                       x_scale, HALF, K_HEADS_P, HALF_P, PARTS, W_SCALED, X_SCALED, dtype)
    heads = tl.arange(0, K_HEADS_P)[:, None]
    full = tl.arange(0, 2 * HALF_P)[None, :]
    mask = (heads < heads_written) & (full < 2 * HALF)
    cols = (num_q_heads + num_k_heads) * 2 * HALF + heads * 2 * HALF + full
    v = _finished(row_ptr, plane, cols, mask, ws_ptr, x_scale, PARTS, W_SCALED, X_SCALED, dtype)
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch + full
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
    pdl.inputs_read(USE_PDL)


def rotate_parts_and_write_kv(positions: torch.Tensor, parts: torch.Tensor,
                              w_scale: torch.Tensor | None, x_scale: torch.Tensor | None,
                              num_q_heads: int, dtype: torch.dtype, cos_sin: torch.Tensor,
                              k_cache: torch.Tensor, v_cache: torch.Tensor,
                              slot_mapping: torch.Tensor) -> torch.Tensor:
    """`rotary.rotate_and_write_kv(positions, q, k, v, ...)` (no norms) where q, k, v are the
    head views [T, H, D] of the QKV GEMM's output [T, (Hq + 2 Hk) D] in `dtype`: parts
    [P, T, N] fp32 summed in part order, times w_scale [N] (the weight rows'; None: none),
    times x_scale [T] (the tokens'; None: none), rounded to dtype. Returns the rotated q
    [T, Hq, D]; k (rotated) and v go to their slots of the pool (slot -1: not written)."""
    splits, tokens, n = parts.shape
    num_k_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if (n != (num_q_heads + 2 * num_k_heads) * head_dim or not parts.is_contiguous()
            or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1):
        raise ValueError(f"rotate_parts_and_write_kv: contiguous parts [P, T, (Hq + 2 Hk) D] "
                         f"and pools with contiguous heads, got parts {tuple(parts.shape)}, "
                         f"{num_q_heads} q heads, pool {tuple(k_cache.shape)}")
    q_out = torch.empty(tokens, num_q_heads, head_dim, dtype=dtype, device=parts.device)
    half = head_dim // 2
    cos_sin = cos_sin.contiguous()
    _parts_rotary_kernel[(tokens,)](
        q_out, k_cache, v_cache, parts, parts if w_scale is None else w_scale.reshape(-1),
        parts if x_scale is None else x_scale.reshape(-1), positions.contiguous(), cos_sin,
        slot_mapping, tokens * n, cos_sin.stride(0), num_q_heads, num_k_heads,
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        N=n, HALF=half, HALF_P=triton.next_power_of_2(half),
        Q_HEADS_P=triton.next_power_of_2(num_q_heads),
        K_HEADS_P=triton.next_power_of_2(num_k_heads), BLOCK_SIZE=k_cache.shape[1],
        PARTS=splits, W_SCALED=w_scale is not None, X_SCALED=x_scale is not None,
        num_warps=4, enable_fp_fusion=False, EARLY_LOADS=pdl.early_loads(),
        **pdl.launch_options(parts.device))
    return q_out
