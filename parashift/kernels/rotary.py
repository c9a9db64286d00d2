"""Rotary embedding (neox 'rotate half' layout) of q and k in one launch; one
program per token. Rounds like parashift.layers.rotary.apply_rotary_torch:
fp32 math, one rounding to the input dtype at the end. `rotate_and_write_kv`
also puts the rotated k and the v of each token straight into its slot of the
paged KV pool ([num_blocks, block_size, kv_heads, head_dim]), which saves the
separate KV write of a step."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl


@triton.jit
def _rms_norm_halves(x1, x2, w_ptr, eps, dims, dtype: tl.constexpr, HALF: tl.constexpr):
    """Each head's RMS norm (Qwen3's q/k norms) of its halves [heads, HALF] in fp32, rounded as
    layers.layernorm.rms_norm_torch rounds: the normalized values, then their weighted ones,
    to `dtype`."""
    squares = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
    rstd = tl.math.rsqrt(squares * (1.0 / (2 * HALF)) + eps)
    w1 = tl.load(w_ptr + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    n1 = (x1 * rstd[:, None]).to(dtype).to(tl.float32)
    n2 = (x2 * rstd[:, None]).to(dtype).to(tl.float32)
    return (w1 * n1).to(dtype).to(tl.float32), (w2 * n2).to(dtype).to(tl.float32)


@triton.jit
def _rotated_heads(x_rows, ok, cos, sin, norm_w_ptr, eps, HALF: tl.constexpr,
                   HALF_P: tl.constexpr, QK_NORM: tl.constexpr):
    """The heads at x_rows (pointers [R], those where `ok`) loaded as halves, RMS-normed
    (QK_NORM) and rotated: their two halves [R, HALF_P] in fp32, before rounding (cos, sin
    [1, HALF_P])."""
    dims = tl.arange(0, HALF_P)[None, :]
    mask = ok[:, None] & (dims < HALF)
    src = x_rows[:, None] + dims
    x1 = tl.load(src, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        x1, x2 = _rms_norm_halves(x1, x2, norm_w_ptr, eps, dims, dtype, HALF)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _rotate_heads(dst_ptr, dst_stride_h, x_ptr, token, cos, sin, stride_t, stride_h, num_heads,
                  norm_w_ptr, eps, HALF: tl.constexpr, HEADS_P: tl.constexpr,
                  HALF_P: tl.constexpr, QK_NORM: tl.constexpr):
    heads = tl.arange(0, HEADS_P)
    ok = heads < num_heads
    y1, y2 = _rotated_heads(x_ptr + token * stride_t + heads * stride_h, ok, cos, sin,
                            norm_w_ptr, eps, HALF, HALF_P, QK_NORM)
    dims = tl.arange(0, HALF_P)[None, :]
    mask = ok[:, None] & (dims < HALF)
    dst = dst_ptr + heads[:, None] * dst_stride_h + dims
    tl.store(dst, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(q_out_ptr, k_out_ptr, q_ptr, k_ptr, positions_ptr, cos_sin_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                   num_q_heads, num_k_heads,
                   v_ptr, v_cache_ptr, slot_mapping_ptr, stride_vt, stride_vh,
                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                   q_norm_ptr, k_norm_ptr, eps,
                   HALF: tl.constexpr, HALF_P: tl.constexpr, Q_HEADS_P: tl.constexpr,
                   K_HEADS_P: tl.constexpr, WRITE_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   QK_NORM: tl.constexpr, USE_PDL: tl.constexpr,
                   EARLY_LOADS: tl.constexpr = True):
    """k_out_ptr is the K pool when WRITE_KV, else a [tokens, heads, 2 * HALF] output;
    QK_NORM: each q and k head RMS-normed (weights q_norm_ptr, k_norm_ptr) before RoPE.
    EARLY_LOADS: the positions, their cos and sin and the slots (no kernel's outputs) loaded
    during the kernel before."""
    if not EARLY_LOADS:
        pdl.start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_P)[None, :]
    row = cos_sin_ptr + pos * stride_cs + dims
    cos = tl.load(row, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF, mask=dims < HALF, other=0.0).to(tl.float32)
    if WRITE_KV:
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if EARLY_LOADS:
        pdl.start(USE_PDL)
    _rotate_heads(q_out_ptr + token * num_q_heads * 2 * HALF, 2 * HALF, q_ptr, token, cos, sin,
                  stride_qt, stride_qh, num_q_heads, q_norm_ptr, eps, HALF, Q_HEADS_P, HALF_P,
                  QK_NORM)
    if WRITE_KV:
        heads_written = tl.where(slot >= 0, num_k_heads, 0)  # slot -1: a padding row
        slot = tl.maximum(slot, 0)
        block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        _rotate_heads(k_out_ptr + block * stride_kcb + offset * stride_kcs, stride_kch, k_ptr,
                      token, cos, sin, stride_kt, stride_kh, heads_written, k_norm_ptr, eps, HALF,
                      K_HEADS_P, HALF_P, QK_NORM)
        heads = tl.arange(0, K_HEADS_P)[:, None]
        full = tl.arange(0, 2 * HALF_P)[None, :]
        mask = (heads < heads_written) & (full < 2 * HALF)
        v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + full, mask=mask)
        v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch + full
        tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
    else:
        _rotate_heads(k_out_ptr + token * num_k_heads * 2 * HALF, 2 * HALF, k_ptr, token, cos,
                      sin, stride_kt, stride_kh, num_k_heads, k_norm_ptr, eps, HALF, K_HEADS_P,
                      HALF_P, QK_NORM)
    pdl.inputs_read(USE_PDL)  # its loads and stores interleave: LATE is its end


def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 cos_sin: torch.Tensor, norms: tuple | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] (any strides), positions [T], cos_sin
    [max_pos, D] = cat(cos, sin) -> rotated copies of q and k, contiguous; norms: (q's RMS
    norm weight [D], k's, eps), each head normed before it is rotated."""
    q, k = _unit_stride(q), _unit_stride(k)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    q_out = _launch(positions, q, k, cos_sin, k_out, None, None, None, norms)
    return q_out, k_out


def rotate_and_write_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, cos_sin: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                        norms: tuple | None = None) -> torch.Tensor:
    """As apply_rotary, but the rotated k and v go to their slots of the KV pool
    (slot -1: not written); returns the rotated q."""
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("KV cache head_dim must be contiguous")
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    return _launch(positions, q, k, cos_sin, k_cache, v, v_cache, slot_mapping, norms)


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(positions, q, k, cos_sin, k_out, v, v_cache, slot_mapping, norms) -> torch.Tensor:
    write_kv = v is not None
    cos_sin = cos_sin.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    half = q.shape[-1] // 2
    cache_strides = (*k_out.stride()[:3], *v_cache.stride()[:3]) if write_kv else (0,) * 6
    q_norm, k_norm, eps = norms if norms is not None else (q, q, 0.0)
    _rotary_kernel[(q.shape[0],)](
        q_out, k_out, q, k, positions.contiguous(), cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
        q.shape[1], k.shape[1],
        v if write_kv else q, v_cache if write_kv else q, slot_mapping if write_kv else positions,
        v.stride(0) if write_kv else 0, v.stride(1) if write_kv else 0, *cache_strides,
        q_norm, k_norm, eps,
        HALF=half, HALF_P=triton.next_power_of_2(half),
        Q_HEADS_P=triton.next_power_of_2(q.shape[1]), K_HEADS_P=triton.next_power_of_2(k.shape[1]),
        WRITE_KV=write_kv, BLOCK_SIZE=k_out.shape[1] if write_kv else 1,
        QK_NORM=norms is not None, num_warps=4, enable_fp_fusion=False,
        EARLY_LOADS=pdl.early_loads(), **pdl.launch_options(q.device))
    return q_out
