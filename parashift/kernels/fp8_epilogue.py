"""The end of the FP8-weight GEMM kernels' output tiles (fp8_gemm.py's and fp8_gemm_tma.py's):
the fp32 sums scaled per output row (and per token for FP8 activations), the bias added,
stored in y's dtype; a K split's parts summed by tickets (split_tickets.py) or atomically."""
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets

OFF = tl.constexpr(pdl.OFF)  # a kernel's USE_PDL where it calls no PDL op


@triton.jit
def finish_tile(acc, xs_ptr, s_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym,
                bias_here, HAS_BIAS: tl.constexpr, FP8_X: tl.constexpr,
                ATOMIC: tl.constexpr, USE_PDL: tl.constexpr):
    """The tile's sums [BLOCK_M, BLOCK_N] scaled (the bias added where bias_here), stored in
    y's dtype, or added atomically to the fp32 y (ATOMIC: a part of K of several); USE_PDL:
    LATE lets the dependents launch before the stores."""
    acc *= tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if FP8_X:
        acc *= tl.load(xs_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    if HAS_BIAS:
        if bias_here:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    pdl.inputs_read(USE_PDL)
    y = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if ATOMIC:
        tl.atomic_add(y, acc, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed")
    else:
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def finish_split_tile(acc, xs_ptr, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, M, N,
                      stride_ym, offs_m, offs_n, m_ok, n_ok, split, tile,
                      HAS_BIAS: tl.constexpr, FP8_X: tl.constexpr, SPLIT_K: tl.constexpr,
                      TICKETS: tl.constexpr, USE_PDL: tl.constexpr):
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
            finish_tile(total, xs_ptr, s_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok,
                        stride_ym, True, HAS_BIAS, FP8_X, False, OFF)
    else:
        finish_tile(acc, xs_ptr, s_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym,
                    split == 0, HAS_BIAS, FP8_X, SPLIT_K > 1, USE_PDL)
