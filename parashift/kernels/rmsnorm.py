"""RMSNorm over the last dim, optionally fused with the residual add; one
program per row. Rounds like parashift.layers.layernorm.rms_norm_torch: the
add in the input dtype, the normalisation in fp32 rounded to that dtype, then
the product with the weight rounded again."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(out_ptr, new_x_ptr, x_ptr, residual_ptr, weight_ptr, eps,
                     stride_xr, stride_xh, stride_rr, stride_rh,
                     N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    out_offs = (row * tl.num_programs(1) + head) * N + cols
    x = tl.load(x_ptr + row * stride_xr + head * stride_xh + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_rr + head * stride_rh + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(new_x_ptr.dtype.element_ty)
        tl.store(new_x_ptr + out_offs, x, mask=mask)
    xf = x.to(tl.float32)
    # torch's CUDA mean multiplies the sum by fl(1 / N)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) * (1.0 / N) + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim; x of any rank and strides."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass."""
    return _launch(x, residual, weight, eps)


def _launch(x, residual, weight, eps):
    dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    new_x = x if residual is None else torch.empty(x.shape, dtype=dtype, device=x.device)
    out = torch.empty(x.shape, dtype=torch.promote_types(dtype, weight.dtype), device=x.device)
    xs = _as_3d(x)
    rs = xs if residual is None else _as_3d(residual)
    rows, heads, n = xs.shape
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows, heads)](
        out, new_x, xs, rs, weight.contiguous(), eps,
        xs.stride(0), xs.stride(1), rs.stride(0), rs.stride(1),
        N=n, BLOCK=block, HAS_RESIDUAL=residual is not None,
        num_warps=min(max(block // 256, 1), 8), enable_fp_fusion=False)
    return out, new_x


def _as_3d(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, heads, n] with unit stride on n; a view where strides allow."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() < 3:
        return x.reshape(-1, 1, x.shape[-1])
    return x.reshape(-1, *x.shape[-2:])
