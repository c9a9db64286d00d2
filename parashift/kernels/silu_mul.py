"""silu(gate) * up for x = [.., 2 * d] holding [gate | up]. Rounds like
parashift.layers.activation.silu_and_mul_torch: silu in fp32 rounded to x's
dtype, then the product rounded again. `silu_and_mul_fp8` also writes each row
in E4M3 with its scale, as `fp8_gemm.quantize_rows` makes them of the output: each
product computed once and stored, the row's largest magnitude found, then the stored
row read back from L2 and quantized (by the row's last program where several share it)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets
from parashift.kernels.silu_values import silu_mul_values
from parashift.kernels.fp8_gemm import FP8, FP8_MAX, row_scale, to_fp8

MAX_BLOCK = 1024
# silu_and_mul_fp8 below SPLIT_ROWS rows: SPLIT_BLOCK columns a program (8 a thread), the
# row's last program quantizing it SPLIT_QUANT_BLOCK columns a step (64 a thread: 14336 in
# one); from SPLIT_ROWS rows (prefill: programs enough), a program a row, ROW_BLOCK columns a
# step (16 a thread). 40 and 72 registers on sm_90 (ptxas), no spills
SPLIT_BLOCK, SPLIT_QUANT_BLOCK, SPLIT_WARPS, ROW_BLOCK, ROW_WARPS = 2048, 16384, 8, 2048, 4
SPLIT_ROWS, MAX_SPLIT_ROWS = 1024, 4096  # split by default below; counters for up to


@triton.jit
def _silu_mul(gate_ptrs, mask, half, LIBDEVICE: tl.constexpr):
    """silu(gate) * up in fp32 (for the caller to round) of the gates at `gate_ptrs`, their
    ups `half` further."""
    gate = tl.load(gate_ptrs, mask=mask, other=0.0)
    up = tl.load(gate_ptrs + half, mask=mask, other=0.0)
    return silu_mul_values(gate, up, LIBDEVICE)


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, d, BLOCK: tl.constexpr,
                         LIBDEVICE: tl.constexpr, USE_PDL: tl.constexpr):
    pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    out = _silu_mul(x_ptr + row * stride_x + cols, mask, d, LIBDEVICE)
    pdl.inputs_read(USE_PDL)
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
def _quantize_stored_row(out_row, q_row, d, scale, FP8_MAX: tl.constexpr,
                         BLOCK: tl.constexpr):
    """The E4M3 values of a row of the output, read back from L2 (its stores came from
    other threads, before a barrier or a ticket), as _quantize_rows_kernel's."""
    for start in range(0, d, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        out = tl.load(out_row + cols, mask=cols < d, other=0.0, cache_modifier=".cg")
        to_fp8(out.to(tl.float32), scale, q_row + cols, cols < d, FP8_MAX)


@triton.jit
def _silu_and_mul_fp8_split_kernel(out_ptr, q_ptr, s_ptr, x_ptr, part_max_ptr, ticket_ptr,
                                   stride_x, d, half, FP8_MAX: tl.constexpr,
                                   BLOCK: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                                   PARTS: tl.constexpr, BLOCKED: tl.constexpr,
                                   LIBDEVICE: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (row, part): the part's output and its largest magnitude stored; the row's
    last program to take a ticket (the counter then set back to 0 for the next launch)
    has them all, and quantizes the row."""
    pdl.start(USE_PDL)
    row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    parts = tl.num_programs(1)
    out_row = out_ptr + row * d
    cols, mask, prod = _fp8_row_block(x_ptr + row * stride_x, part * BLOCK, d, half, BLOCK,
                                      BLOCKED, LIBDEVICE)
    pdl.inputs_read(USE_PDL)
    out = prod.to(out_ptr.dtype.element_ty)  # masked columns are 0
    tl.store(out_row + cols, out, mask=mask)
    tl.store(part_max_ptr + row * parts + part, tl.max(tl.abs(out.to(tl.float32)), axis=0))
    tl.debug_barrier()  # every thread's stores before the ticket (released with it)
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == parts - 1:
        tl.atomic_xchg(ticket_ptr + row, 0, sem="relaxed")
        tl.debug_barrier()  # the ticket's acquire before any thread's loads
        p = tl.arange(0, PARTS)
        part_max = tl.load(part_max_ptr + row * parts + p, mask=p < parts, other=0.0,
                           cache_modifier=".cg")
        scale = row_scale(tl.max(part_max, axis=0), FP8_MAX)
        _quantize_stored_row(out_row, q_ptr + row * d, d, scale, FP8_MAX, QUANT_BLOCK)
        tl.store(s_ptr + row, scale)


@triton.jit
def _silu_and_mul_fp8_row_kernel(out_ptr, q_ptr, s_ptr, x_ptr, stride_x, d, half,
                                 FP8_MAX: tl.constexpr, BLOCK: tl.constexpr,
                                 BLOCKED: tl.constexpr, LIBDEVICE: tl.constexpr,
                                 USE_PDL: tl.constexpr):
    """One row per program, each product computed once: the output stored, and its largest
    magnitude kept, over a first pass; after a barrier, its E4M3 values in a second."""
    pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    out_row = out_ptr + row * d
    largest = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, d, BLOCK):
        cols, mask, prod = _fp8_row_block(x_ptr + row * stride_x, start, d, half, BLOCK,
                                          BLOCKED, LIBDEVICE)
        out = prod.to(out_ptr.dtype.element_ty)  # masked columns are 0
        tl.store(out_row + cols, out, mask=mask)
        largest = tl.maximum(largest, tl.abs(out.to(tl.float32)))
    pdl.inputs_read(USE_PDL)
    scale = row_scale(tl.max(largest, axis=0), FP8_MAX)
    tl.debug_barrier()
    _quantize_stored_row(out_row, q_ptr + row * d, d, scale, FP8_MAX, BLOCK)
    tl.store(s_ptr + row, scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[.., 2 * d] -> [.., d]; x of any strides."""
    rows, out = _rows_and_output(x)
    d = out.shape[-1]
    block = min(triton.next_power_of_2(d), MAX_BLOCK)
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
        out, rows, rows.stride(0), d, BLOCK=block, LIBDEVICE=x.is_cuda,
        num_warps=4, enable_fp_fusion=False, **pdl.launch_options(x.device))
    return out


def silu_and_mul_fp8(x: torch.Tensor, blocks: int = 1, split: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, out's rows in E4M3 [rows, d], fp32 scale [rows, 1]) in one kernel, quantized
    as `fp8_gemm.quantize_rows(out)` quantizes them. out [.., d]: silu_and_mul(x), or with
    `blocks` [gate_i | up_i] blocks on x's last dim the outputs [out_0 | out_1 | ..] (as
    `layers.activation.SiluAndMul` lays them out). split: each row over several programs
    (by default below SPLIT_ROWS rows; never above MAX_SPLIT_ROWS, nor in a CUDA graph
    capture before the device's counters are made) or one program a row."""
    rows, out = _rows_and_output(x)
    (m, d), half = out.reshape(-1, out.shape[-1]).shape, out.shape[-1] // blocks
    if d % blocks:
        raise ValueError(f"silu_and_mul_fp8: {x.shape[-1]} columns are not {blocks} blocks")
    q = torch.empty(m, d, dtype=FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    args = dict(out_ptr=out, q_ptr=q, s_ptr=scale, x_ptr=rows, stride_x=rows.stride(0), d=d,
                half=half, FP8_MAX=FP8_MAX, BLOCKED=blocks > 1, LIBDEVICE=x.is_cuda,
                enable_fp_fusion=False, **pdl.launch_options(x.device))
    tickets = _row_tickets(x.device)
    if tickets is None or not (m < SPLIT_ROWS if split is None else split) \
            or m > MAX_SPLIT_ROWS:
        _silu_and_mul_fp8_row_kernel[(m,)](**args, BLOCK=ROW_BLOCK, num_warps=ROW_WARPS)
        return out, q, scale
    parts = triton.cdiv(d, SPLIT_BLOCK)
    _silu_and_mul_fp8_split_kernel[(m, parts)](
        **args, part_max_ptr=torch.empty(m, parts, dtype=torch.float32, device=x.device),
        ticket_ptr=tickets, BLOCK=SPLIT_BLOCK, PARTS=triton.next_power_of_2(parts),
        QUANT_BLOCK=min(triton.next_power_of_2(d), SPLIT_QUANT_BLOCK), num_warps=SPLIT_WARPS)
    return out, q, scale


def _row_tickets(device: torch.device) -> torch.Tensor | None:
    """The device's row counters for the split kernel (split_tickets.py's, each back at 0
    after a launch); None before they are made (not during a CUDA graph capture)."""
    return split_tickets.counters(device, MAX_SPLIT_ROWS)


def _rows_and_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as [rows, 2 d] with unit stride on the last dim, and an empty [.., d] output."""
    d = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows, torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
