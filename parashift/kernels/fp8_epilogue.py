"""The end of the FP8-weight GEMM kernels' output tiles (fp8_gemm.py's and fp8_gemm_tma.py's):
the fp32 sums scaled per output row (and per token for FP8 activations), the bias added,
stored in y's dtype; a K split's parts summed by tickets (split_tickets.py) or atomically.

The scales and bias are loaded by `tile_scales`, after the main loop or, where a kernel's
EARLY_SCALES (`early_scales()`, PARASHIFT_FP8_EARLY_SCALES, on by default) asks, before it
(after the PDL wait: the token scales are the kernel before's output), so that the tile's
end waits on no load but the parts of a split. Only without a bias: with one, the compiler
contracts the bias add into an FMA in one placement and not the other (other bits, seen on an
H200), so a biased layer loads them after the loop either way. On one H200 (8B FP8 layers at
64 rows, decode chain): 1.0046x a layer (docs/benchmark_log.md, helper fp8b64)."""

import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import pdl, split_tickets

OFF = tl.constexpr(pdl.OFF)  # a kernel's USE_PDL where it calls no PDL op
EARLY_SCALES_ENV, DEFAULT_EARLY_SCALES = "PARASHIFT_FP8_EARLY_SCALES", "1"


def early_scales(has_bias: bool = False) -> bool:
    """PARASHIFT_FP8_EARLY_SCALES (0 or 1, 1 by default; read at each launch, a CUDA graph
    keeps what its capture read): whether an FP8 GEMM without a bias loads its tile's scales
    before the main loop (with a bias: never, module docstring)."""
    return _flag(EARLY_SCALES_ENV, DEFAULT_EARLY_SCALES) and not has_bias


def _flag(name: str, default: str) -> bool:
    return switch(name, default)


@triton.jit
def tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, HAS_BIAS: tl.constexpr,
                FP8_X: tl.constexpr):
    """(the weight rows' scales, the tokens' scales where FP8_X, the bias where HAS_BIAS),
    fp32, of the tile at (offs_m, offs_n): nothing is read for what is not there."""
    w_scale = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)
    x_scale, bias = w_scale, w_scale  # unused where FP8_X, HAS_BIAS are not
    if FP8_X:
        x_scale = tl.load(xs_ptr + offs_m, mask=m_ok, other=0.0)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    return w_scale, x_scale, bias


@triton.jit
def finish_tile(acc, scales, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym, bias_here,
                HAS_BIAS: tl.constexpr, FP8_X: tl.constexpr, ATOMIC: tl.constexpr,
                USE_PDL: tl.constexpr):
    """The tile's sums [BLOCK_M, BLOCK_N] scaled by `tile_scales`' (the bias added where
    bias_here), stored in y's dtype, or added atomically to the fp32 y (ATOMIC: a part of K
    of several); USE_PDL: LATE lets the dependents launch before the stores."""
    w_scale, x_scale, bias = scales
    acc *= w_scale[None, :]
    if FP8_X:
        acc *= x_scale[:, None]
    if HAS_BIAS:
        if bias_here:
            acc += bias[None, :]
    pdl.inputs_read(USE_PDL)
    y = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if ATOMIC:
        tl.atomic_add(y, acc, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed")
    else:
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def finish_split_tile(acc, scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym, offs_m,
                      offs_n, m_ok, n_ok, split, tile, HAS_BIAS: tl.constexpr,
                      FP8_X: tl.constexpr, SPLIT_K: tl.constexpr, TICKETS: tl.constexpr,
                      USE_PDL: tl.constexpr):
    """`finish_tile` of this program's part `split` of K (of SPLIT_K) of output tile `tile`:
    the whole sum where SPLIT_K is 1; else (TICKETS) the part stored and the tile's last
    program to take its ticket sums them in split order and finishes, or the part added
    atomically to the fp32 y."""
    if TICKETS:
        pdl.inputs_read(USE_PDL)
        tile_ok = m_ok[:, None] & n_ok[None, :]
        plane_offs = offs_m[:, None] * N + offs_n[None, :]
        counter = counter_ptr + tile
        tl.store(part_ptr + split * M * N + plane_offs, acc, mask=tile_ok)
        if split_tickets.is_last(counter, SPLIT_K):
            split_tickets.reset(counter)
            total = split_tickets.summed_parts(part_ptr + plane_offs, M * N, tile_ok, SPLIT_K)
            finish_tile(total, scales, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym, True,
                        HAS_BIAS, FP8_X, False, OFF)
    else:
        finish_tile(acc, scales, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym, split == 0,
                    HAS_BIAS, FP8_X, SPLIT_K > 1, USE_PDL)


@triton.jit
def store_part(acc, part_ptr, M, N, offs_m, offs_n, m_ok, n_ok, split, USE_PDL: tl.constexpr):
    """A parts-out GEMM's end (kernels/parts_rmsnorm.py sums the parts): this program's part
    `split` of K, unscaled fp32, into plane `split` of parts [SPLIT_K, M, N], as the ticket
    path stores it before its last program sums the planes."""
    pdl.inputs_read(USE_PDL)
    plane_offs = offs_m[:, None] * N + offs_n[None, :]
    tl.store(part_ptr + split * M * N + plane_offs, acc, mask=m_ok[:, None] & n_ok[None, :])
