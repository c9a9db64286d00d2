"""silu(gate) * up for x = [.., 2 * d] holding [gate | up]. Rounds like
parashift.layers.activation.silu_and_mul_torch: silu in fp32 rounded to x's
dtype, then the product rounded again. `silu_and_mul_fp8` also writes each row
in E4M3 with its scale, as `fp8_gemm.quantize_rows` makes them of the output."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from parashift.kernels.fp8_gemm import FP8, FP8_MAX

MAX_BLOCK = 1024
# a row's columns per step of silu_and_mul_fp8's loop, 16 a thread: 8192 at 16 warps keeps
# 32 KiB of a row's inputs in flight in 100 registers (sm_90, no spills); the rows are few
# at decode, one program each
MAX_FP8_BLOCK = 8192


@triton.jit
def _silu_mul(gate_ptrs, mask, half, LIBDEVICE: tl.constexpr):
    """silu(gate) * up in fp32 (for the caller to round) of the gates at `gate_ptrs`, their
    ups `half` further."""
    gate = tl.load(gate_ptrs, mask=mask, other=0.0)
    up = tl.load(gate_ptrs + half, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # torch's silu is g / (1 + expf(-g)): libdevice's expf and an IEEE division
    # (tl.exp is ex2.approx, `/` div.full); the interpreter has no libdevice
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.math.div_rn(g, 1.0 + e).to(gate.dtype)
    return silu.to(tl.float32) * up.to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, d, BLOCK: tl.constexpr,
                         LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    out = _silu_mul(x_ptr + row * stride_x + cols, mask, d, LIBDEVICE)
    tl.store(out_ptr + row * d + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_row_block(x_row, start, d, half, BLOCK: tl.constexpr, BLOCKED: tl.constexpr,
                   LIBDEVICE: tl.constexpr):
    """Output columns start..start + BLOCK of a row of `d`, from [gate | up] blocks of
    2 * half (one block unless BLOCKED): (the columns, their mask, their fp32 values)."""
    cols = start + tl.arange(0, BLOCK)
    gate_cols = cols
    if BLOCKED:
        gate_cols = cols // half * (2 * half) + cols % half
    mask = cols < d
    return cols, mask, _silu_mul(x_row + gate_cols, mask, half, LIBDEVICE)


@triton.jit
def _silu_and_mul_fp8_kernel(out_ptr, q_ptr, s_ptr, x_ptr, stride_x, d, half,
                             FP8_MAX: tl.constexpr, BLOCK: tl.constexpr,
                             BLOCKED: tl.constexpr, LIBDEVICE: tl.constexpr):
    """One row per program: its largest magnitude over a first pass, then the output and
    its E4M3 values (as _quantize_rows_kernel's) recomputed in a second: the row's inputs
    are then in L2, and no thread reads what another wrote."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    largest = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, d, BLOCK):
        cols, mask, prod = _fp8_row_block(x_row, start, d, half, BLOCK, BLOCKED, LIBDEVICE)
        out = prod.to(out_ptr.dtype.element_ty)  # masked columns are 0
        largest = tl.maximum(largest, tl.abs(out.to(tl.float32)))
    scale = tl.maximum(tl.max(largest, axis=0), 1e-12) / FP8_MAX
    for start in range(0, d, BLOCK):
        cols, mask, prod = _fp8_row_block(x_row, start, d, half, BLOCK, BLOCKED, LIBDEVICE)
        out = prod.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * d + cols, out, mask=mask)
        q = tl.clamp(out.to(tl.float32) / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + row * d + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[.., 2 * d] -> [.., d]; x of any strides."""
    rows, out = _rows_and_output(x)
    d = out.shape[-1]
    block = min(triton.next_power_of_2(d), MAX_BLOCK)
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
        out, rows, rows.stride(0), d, BLOCK=block, LIBDEVICE=x.is_cuda,
        num_warps=4, enable_fp_fusion=False)
    return out


def silu_and_mul_fp8(x: torch.Tensor, blocks: int = 1
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, out's rows in E4M3 [rows, d], fp32 scale [rows, 1]) in one kernel, quantized
    as `fp8_gemm.quantize_rows(out)` quantizes them. out [.., d]: silu_and_mul(x), or with
    `blocks` [gate_i | up_i] blocks on x's last dim the outputs [out_0 | out_1 | ..] (as
    `layers.activation.SiluAndMul` lays them out)."""
    rows, out = _rows_and_output(x)
    d = out.shape[-1]
    if d % blocks:
        raise ValueError(f"silu_and_mul_fp8: {x.shape[-1]} columns are not {blocks} blocks")
    q = torch.empty(rows.shape[0], d, dtype=FP8, device=x.device)
    scale = torch.empty(rows.shape[0], 1, dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(d), MAX_FP8_BLOCK)
    _silu_and_mul_fp8_kernel[(rows.shape[0],)](
        out, q, scale, rows, rows.stride(0), d, d // blocks, FP8_MAX=FP8_MAX, BLOCK=block,
        BLOCKED=blocks > 1, LIBDEVICE=x.is_cuda, num_warps=min(max(block // 512, 1), 16),
        enable_fp_fusion=False)
    return out, q, scale


def _rows_and_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as [rows, 2 d] with unit stride on the last dim, and an empty [.., d] output."""
    d = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows, torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
