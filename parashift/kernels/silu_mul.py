"""silu(gate) * up for x = [.., 2 * d] holding [gate | up]. Rounds like
parashift.layers.activation.silu_and_mul_torch: silu in fp32 rounded to x's
dtype, then the product rounded again."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, d, BLOCK: tl.constexpr,
                         LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # torch's silu is g / (1 + expf(-g)): libdevice's expf and an IEEE division
    # (tl.exp is ex2.approx, `/` div.full); the interpreter has no libdevice
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.math.div_rn(g, 1.0 + e).to(gate.dtype)
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * d + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[.., 2 * d] -> [.., d]; x of any strides."""
    d = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(d), MAX_BLOCK)
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
        out, rows, rows.stride(0), d, BLOCK=block, LIBDEVICE=x.is_cuda,
        num_warps=4, enable_fp_fusion=False)
    return out
