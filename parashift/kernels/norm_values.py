"""RMSNorm (after the residual add) of an activation row as a GEMV computes its own input from
the row (kernels/fp8_gemv.py's NORM; kernels/norm_gemv.py chooses it): rounded as
kernels/rmsnorm.py's `_rms_norm_kernel` rounds, the add in the row's dtype, the normalised
values rounded to it, then the weight's product rounded again. The sum of squares runs in
the GEMV's layout (its warps), not the norm kernel's, so 1/rms may differ from that kernel's
in its last bits; every other operation is the norm kernel's."""
import triton
import triton.language as tl


@triton.jit
def added_row(x_row_ptr, r_row_ptr, k, mask, HAS_RESIDUAL: tl.constexpr):
    """x + residual at columns k (masked: 0), rounded to x's dtype; x alone without one."""
    x = tl.load(x_row_ptr + k, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_row_ptr + k, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def row_rstd(x_row_ptr, r_row_ptr, h_row_ptr, store_end, K, inv_k, eps,
             HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """1 / rms of the row x + residual (K wide, read in CHUNKS of BLOCK columns); its columns
    before store_end (K in one program of the GEMV, 0 in the others) stored at h_row_ptr
    (the new residual)."""
    offs = tl.max_contiguous(tl.arange(0, BLOCK), 8)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for chunk in tl.static_range(CHUNKS):
        k = chunk * BLOCK + offs
        h = added_row(x_row_ptr, r_row_ptr, k, k < K, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(h_row_ptr + k, h, mask=k < store_end)
        hf = h.to(tl.float32)
        squares += hf * hf
    # the norm kernel's mean: the sum times fl(1 / K)
    return tl.math.rsqrt(tl.sum(squares, 0) * inv_k + eps)


@triton.jit
def normed_row(x_row_ptr, r_row_ptr, nw_ptr, k, mask, rstd, HAS_RESIDUAL: tl.constexpr):
    """rms_norm(x + residual) at columns k, in x's dtype, from the row's 1 / rms."""
    h = added_row(x_row_ptr, r_row_ptr, k, mask, HAS_RESIDUAL)
    normed = (h.to(tl.float32) * rstd).to(h.dtype).to(tl.float32)
    w = tl.load(nw_ptr + k, mask=mask, other=0.0).to(tl.float32)
    return (w * normed).to(h.dtype)
