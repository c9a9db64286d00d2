"""The residual-add RMSNorm that finishes a split-K GEMM's sum (issues 60/61: decode at 64
rows). A parts-out GEMM (fp8_gemm_tma.tma_parts, dense_gemm_tma.tma_parts) stores each part
of K unscaled, fp32, with no tickets; this norm's program for a row sums the row's parts in
part order, scales the sum by the weight rows' scales and the token's scale (FP8), rounds it
to the activations' dtype (as split_tickets' last program and fp8_epilogue.finish_tile do:
the same bits), then adds the residual and normalizes as kernels/rmsnorm.py's kernel does
(its code, its layout: VEC from the same tensors' dtypes, so the same sum of squares)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl
from parashift.kernels.fp8_gemm import FP8, FP8_MAX
from parashift.kernels.rmsnorm import add_residual, normalize_row, num_warps, vector_width


@triton.jit
def _parts_rms_norm_kernel(out_ptr, new_x_ptr, q_ptr, s_ptr, part_ptr, ws_ptr, xs_ptr,
                           residual_ptr, weight_ptr, eps, rows, stride_rr,
                           N: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr,
                           W_SCALED: tl.constexpr, X_SCALED: tl.constexpr,
                           QUANT: tl.constexpr, FP8_MAX: tl.constexpr, VEC: tl.constexpr,
                           USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.max_contiguous(tl.arange(0, BLOCK), VEC)
    mask = cols < N
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # before the wait
    if W_SCALED:
        w_scale = tl.load(ws_ptr + cols, mask=mask, other=0.0)
    pdl.start(USE_PDL)
    out_offs = row * N + cols
    total = tl.load(part_ptr + out_offs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, PARTS):
        total += tl.load(part_ptr + s * rows * N + out_offs, mask=mask, other=0.0,
                         cache_modifier=".cg")
    if W_SCALED:
        total *= w_scale
    if X_SCALED:
        total *= tl.load(xs_ptr + row)
    y = total.to(new_x_ptr.dtype.element_ty)  # the GEMM's output, as the ticket path stores it
    r = tl.load(residual_ptr + row * stride_rr + cols, mask=mask, other=0.0)
    x = add_residual(y, r, new_x_ptr, out_offs, mask)
    normalize_row(x, w, out_ptr, out_offs, q_ptr, s_ptr, row, mask, eps, N, QUANT, FP8_MAX,
                  USE_PDL)


def parts_add_rms_norm(parts: torch.Tensor, w_scale: torch.Tensor | None,
                       x_scale: torch.Tensor | None, residual: torch.Tensor,
                       weight: torch.Tensor, eps: float, quant: bool = False) -> tuple:
    """`rmsnorm.add_rms_norm(y, residual, ...)` (quant: `rmsnorm.rms_norm_fp8`'s four
    outputs) where y [M, N] in residual's dtype is the split GEMM's output: parts [P, M, N]
    fp32 summed in part order, times w_scale [N] (the weight rows' scales; None: none),
    times x_scale [M] (the tokens'; None: none), rounded to residual's dtype."""
    splits, rows, n = parts.shape
    if residual.shape != (rows, n) or residual.stride(-1) != 1 or not parts.is_contiguous():
        raise ValueError(f"parts_add_rms_norm: parts {tuple(parts.shape)} (contiguous) and a "
                         f"residual [{rows}, {n}] with unit column stride, got "
                         f"{tuple(residual.shape)} strides {residual.stride()}")
    dtype = residual.dtype
    new_x = torch.empty(rows, n, dtype=dtype, device=residual.device)
    out = torch.empty(rows, n, dtype=torch.promote_types(dtype, weight.dtype),
                      device=residual.device)
    q, scale = out, out
    if quant:
        q = torch.empty(rows, n, dtype=FP8, device=residual.device)
        scale = torch.empty(rows, 1, dtype=torch.float32, device=residual.device)
    block = triton.next_power_of_2(n)
    _parts_rms_norm_kernel[(rows,)](
        out, new_x, q, scale, parts, parts if w_scale is None else w_scale.reshape(-1),
        parts if x_scale is None else x_scale.reshape(-1), residual, weight.contiguous(), eps,
        rows, residual.stride(0), N=n, BLOCK=block, PARTS=splits,
        W_SCALED=w_scale is not None, X_SCALED=x_scale is not None, QUANT=quant,
        FP8_MAX=FP8_MAX, VEC=vector_width(new_x, residual, weight, out),
        num_warps=num_warps(block), enable_fp_fusion=False, **pdl.launch_options(residual.device))
    return (out, new_x, q, scale) if quant else (out, new_x)
