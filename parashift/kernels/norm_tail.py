"""The residual add and RMSNorm after a GEMV, done by the GEMV launch's last program to finish
(issue 60: one launch a layer fewer at decode's few rows; layers/norm_after_gemv.py wires it).

Each program of the launch stores its tile of the output y, then takes a ticket on one
counter (split_tickets.py: released with its stores); the program that takes the last one
reads the whole rows of y back from L2 and does what `rmsnorm.add_rms_norm` would do next:
h = y + residual (the new residual) and rms_norm(h) (norm_values.py's rounding, its sum of
squares in the GEMV's warps: 1 / rms may differ from the norm kernel's in its last bits),
and with QUANT the normed rows in E4M3 with a scale each, as `fp8_gemm.quantize_rows` makes
them (for a next layer that multiplies FP8 by FP8).

The tail's registers count for the whole kernel (ptxas allocates a kernel's peak), so for the
GEMV's occupancy: the row is read in chunks of TAIL_COLUMNS_PER_WARP columns a warp (a 16-byte
load of 16-bit values a thread), in loops not unrolled. sm_90a ptxas (Triton 3.9, bf16, one
row of the 8B's o, benchmarks/gemv_tail_registers.py), plain -> with the tail: 4x2048 ahead 84
-> 86, 4x1024 ahead 52 -> 54, 8x1024 ahead 89 -> 90 (each within its allocation granule of 8),
4x1024 40 -> 40, 2x2048 43 -> 40; chunks of 512 a warp took 4x1024 to 46 and 2x2048 to 48.
The norm weight, cold by then, is pulled into L2 by the first program before its PDL wait
(`prefetch_weight`), as the norm kernel loads it before its wait."""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets
from parashift.kernels.fp8_values import row_scale, to_fp8
from parashift.kernels.norm_values import added_row, normed_row

TAIL_COLUMNS_PER_WARP = 256
PREFETCH_COLUMNS_MIN = 128  # the norm weight's prefetch: a whole line of any dtype at least
_FP8_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)


class NormTail(NamedTuple):
    """The add and norm after a GEMV's output y [M, N]: the residual [M, N] and norm weight
    [N] (both y's dtype), eps; the outputs it writes: rms_norm(y + residual) `out`, the new
    residual y + residual, and where made, out's rows in E4M3 [M, N] with scales [M, 1]."""
    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    out: torch.Tensor
    new_residual: torch.Tensor
    rows_fp8: torch.Tensor | None
    scales: torch.Tensor | None


def norm_tail(residual: torch.Tensor, weight: torch.Tensor, eps: float,
              quantize: bool) -> NormTail:
    """A NormTail for a GEMV whose output is residual's shape and dtype, its outputs made."""
    rows, n, device = *residual.shape, residual.device
    fp8, scales = ((torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=device),
                    torch.empty(rows, 1, dtype=torch.float32, device=device)) if quantize
                   else (None, None))
    return NormTail(residual, weight.contiguous(), eps, torch.empty_like(residual),
                    torch.empty_like(residual), fp8, scales)


def check(tail: NormTail, y_shape: tuple[int, int], dtype: torch.dtype) -> None:
    """A clear error where the tail's tensors do not fit a GEMV output of y_shape in dtype."""
    rows_ok = all(t.shape == y_shape and t.dtype == dtype and t.stride(1) == 1
                  for t in (tail.residual, tail.out, tail.new_residual))
    if not rows_ok or tail.weight.shape != (y_shape[1],) or tail.weight.dtype != dtype or (
            tail.rows_fp8 is not None and (tail.rows_fp8.shape != y_shape
                                           or tail.scales.shape != (y_shape[0], 1))):
        raise ValueError(f"a GEMV's norm tail takes a residual, outputs and rows in E4M3 of "
                         f"the output's shape {tuple(y_shape)} (unit stride along N) and a "
                         f"norm weight [{y_shape[1]}], in the output's dtype {dtype}")


def launch_args(tail: NormTail | None, num_warps: int, n: int) -> dict:
    """The GEMV kernel's keyword arguments for the tail (none without one)."""
    if tail is None:
        return {}
    block = min(TAIL_COLUMNS_PER_WARP * num_warps, triton.next_power_of_2(n))
    quant = tail.rows_fp8 is not None
    return dict(tr_ptr=tail.residual, tnw_ptr=tail.weight, to_ptr=tail.out,
                th_ptr=tail.new_residual, tq_ptr=tail.rows_fp8 if quant else tail.out,
                tqs_ptr=tail.scales if quant else tail.out,
                stride_trm=tail.residual.stride(0), stride_tom=tail.out.stride(0),
                stride_thm=tail.new_residual.stride(0), inv_n=1.0 / n, tail_eps=tail.eps,
                NORM_TAIL=True, TAIL_QUANT=quant, TAIL_BLOCK=block,
                TAIL_CHUNKS=triton.cdiv(n, block),
                TAIL_PREFETCH=max(PREFETCH_COLUMNS_MIN, triton.next_power_of_2(n)))


@triton.jit
def prefetch_weight(nw_ptr, N, COLS: tl.constexpr, USE_PDL: tl.constexpr):
    """In the launch's first program, before its PDL wait: the norm weight (no kernel's
    output, and cold: a step's weights have streamed through L2 since its last use) pulled
    into L2 for the last program's tail, as the norm kernel loads it before its wait."""
    if USE_PDL:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            pdl.prefetch_rows(nw_ptr, 0, 1, N, 1, COLS)


@triton.jit
def finish(counter_ptr, programs, y_ptr, stride_ym, r_ptr, nw_ptr, o_ptr, h_ptr, q_ptr, qs_ptr,
           stride_rm, stride_om, stride_hm, N, inv_n, eps, ROWS: tl.constexpr,
           BLOCK: tl.constexpr, CHUNKS: tl.constexpr, QUANT: tl.constexpr):
    """After this program's tile of y is stored: its ticket; the last of the launch's
    `programs` programs adds, normalises (and quantizes) each of the ROWS rows of y."""
    if split_tickets.is_last_of(counter_ptr, programs):
        split_tickets.reset(counter_ptr)
        for row in tl.static_range(ROWS):
            _norm_row(y_ptr + row * stride_ym, r_ptr + row * stride_rm, nw_ptr,
                      o_ptr + row * stride_om, h_ptr + row * stride_hm, q_ptr + row * N,
                      qs_ptr + row, N, inv_n, eps, BLOCK, CHUNKS, QUANT)


@triton.jit
def _norm_row(y_row, r_row, nw_ptr, o_row, h_row, q_row, qs_ptr, N, inv_n, eps,
              BLOCK: tl.constexpr, CHUNKS: tl.constexpr, QUANT: tl.constexpr):
    """One row: h = y + residual stored, then rms_norm(h) (and its E4M3 values and scale).
    Chunk by chunk in loops, not unrolled: a chunk's values live at a time."""
    offs = tl.max_contiguous(tl.arange(0, BLOCK), 8)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for chunk in range(0, CHUNKS):
        k = chunk * BLOCK + offs
        h = added_row(y_row, r_row, k, k < N, True, ".cg")
        tl.store(h_row + k, h, mask=k < N)
        squares += h.to(tl.float32) * h.to(tl.float32)
    # the norm kernel's mean: the sum times fl(1 / N)
    rstd = tl.math.rsqrt(tl.sum(squares, 0) * inv_n + eps)
    largest = tl.zeros((BLOCK,), dtype=tl.float32)
    for chunk in range(0, CHUNKS):
        k = chunk * BLOCK + offs
        out = normed_row(y_row, r_row, nw_ptr, k, k < N, rstd, True, ".cg")
        tl.store(o_row + k, out, mask=k < N)
        largest = tl.maximum(largest, tl.abs(out.to(tl.float32)))
    if QUANT:  # the stored rows read back (this program's own stores, from L2)
        scale = row_scale(tl.max(largest, axis=0), _FP8_MAX)
        tl.debug_barrier()
        for chunk in range(0, CHUNKS):
            k = chunk * BLOCK + offs
            out = tl.load(o_row + k, mask=k < N, other=0.0, cache_modifier=".cg")
            to_fp8(out.to(tl.float32), scale, q_row + k, k < N, _FP8_MAX)
        tl.store(qs_ptr, scale)
