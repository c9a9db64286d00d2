"""Rotary embedding (neox 'rotate half' layout) of q and k in one launch; one
program per token. Rounds like parashift.layers.rotary.apply_rotary_torch:
fp32 math, one rounding to the input dtype at the end."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(out_ptr, x_ptr, token, cos, sin, stride_t, stride_h, num_heads,
                  HALF: tl.constexpr, HEADS_P: tl.constexpr, HALF_P: tl.constexpr):
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, HALF_P)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    src = x_ptr + token * stride_t + heads * stride_h + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + (token * num_heads + heads) * (2 * HALF) + dims
    tl.store(dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(q_out_ptr, k_out_ptr, q_ptr, k_ptr, positions_ptr, cos_sin_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                   num_q_heads, num_k_heads, HALF: tl.constexpr, HALF_P: tl.constexpr,
                   Q_HEADS_P: tl.constexpr, K_HEADS_P: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_P)[None, :]
    row = cos_sin_ptr + pos * stride_cs + dims
    cos = tl.load(row, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF, mask=dims < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_out_ptr, q_ptr, token, cos, sin, stride_qt, stride_qh, num_q_heads,
                  HALF, Q_HEADS_P, HALF_P)
    _rotate_heads(k_out_ptr, k_ptr, token, cos, sin, stride_kt, stride_kh, num_k_heads,
                  HALF, K_HEADS_P, HALF_P)


def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] (any strides), positions [T], cos_sin
    [max_pos, D] = cat(cos, sin) -> rotated copies of q and k, contiguous."""
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    cos_sin = cos_sin.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    half = q.shape[-1] // 2
    _rotary_kernel[(q.shape[0],)](
        q_out, k_out, q, k, positions.contiguous(), cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
        q.shape[1], k.shape[1], HALF=half, HALF_P=triton.next_power_of_2(half),
        Q_HEADS_P=triton.next_power_of_2(q.shape[1]), K_HEADS_P=triton.next_power_of_2(k.shape[1]),
        num_warps=4, enable_fp_fusion=False)
    return q_out, k_out
