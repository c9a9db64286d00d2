"""The FP8 GEMV (`fp8_gemv.py`'s y = x (W * s)^T + b at one to four rows) with the weight
streamed by TMA into a shared-memory ring NUM_STAGES tiles deep (issue 60).

`fp8_gemv.py`'s programs load their weight tile into registers: the bytes a program keeps in
flight are its registers' worth, and the loop waits for each tile before it asks for the
next. Here a tensor descriptor (made on the host, out of bounds reads as zeros) copies each
[BLOCK_N, BLOCK_K] tile into shared memory and the compiler's pipeliner keeps NUM_STAGES - 1
tiles in flight behind the one multiplied: the bytes in flight an SM holds are set by its
shared memory, not by its registers. The activations' K slice is loaded with each tile (from
L2; after the PDL wait, as it is an earlier kernel's output). Each thread adds its products
in fp32 per element over the loop; the tile's row sums are taken once after it, then the
epilogue is `fp8_gemv.finish_rows`'s (scale, bias, a store, atomic adds or tickets). The sums
run in another order than `fp8_gemv.py`'s: a config of this kernel is another candidate of
the choice by measurement, not the same bits."""
import torch
import triton
import triton.language as tl

from parashift.kernels import fp8_gemm_tma, fp8_gemv, pdl, split_tickets

MAX_BLOCK_K = fp8_gemm_tma.MAX_BLOCK_K  # a TMA box's dimension


@triton.jit
def _row_products(w, x_row_ptr, k, K, EVEN_K: tl.constexpr):
    """The tile (fp32) times one activation row's K slice, element by element."""
    if EVEN_K:
        x = tl.load(x_row_ptr + k[None, :])
    else:
        x = tl.load(x_row_ptr + k[None, :], mask=k[None, :] < K, other=0.0)
    return w * x.to(tl.float32)


@triton.jit
def _fp8_gemv_tma_kernel(x_ptr, w_desc, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, N, K,
                         stride_xm, stride_ym, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr,
                         EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                         TICKETS: tl.constexpr, USE_PDL: tl.constexpr):
    first_n, split = tl.program_id(0) * BLOCK_N, tl.program_id(1)
    first_k, k_end = fp8_gemv.part_of_k(split, K, BLOCK_K, SPLIT_K)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    pdl.start(USE_PDL)
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(first_k, k_end, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([first_n, k0]).to(tl.float32)
        k = tl.multiple_of(k0, BLOCK_K) + offs_k  # so that x's loads are 16 bytes wide
        acc0 += _row_products(w, x_ptr, k, K, EVEN_K)
        if ROWS > 1:
            acc1 += _row_products(w, x_ptr + stride_xm, k, K, EVEN_K)
        if ROWS > 2:
            acc2 += _row_products(w, x_ptr + 2 * stride_xm, k, K, EVEN_K)
        if ROWS > 3:
            acc3 += _row_products(w, x_ptr + 3 * stride_xm, k, K, EVEN_K)
    pdl.inputs_read(USE_PDL)
    fp8_gemv.finish_rows(y_ptr, stride_ym, part_ptr, counter_ptr, s_ptr, b_ptr,
                         tl.sum(acc0, axis=1), tl.sum(acc1, axis=1), tl.sum(acc2, axis=1),
                         tl.sum(acc3, axis=1), offs_n, N, split, HAS_BIAS, ROWS, SPLIT_K,
                         TICKETS)


def fp8_gemv_tma(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None, block_n: int, block_k: int, num_warps: int,
                 num_stages: int, split_k: int = 1, tickets: bool = False) -> torch.Tensor:
    """`fp8_gemv.fp8_gemv`'s product (x [M <= 4, K], weight [N, K] E4M3 with 16-byte aligned
    rows and unit stride along K, scale [N] or [N, 1] fp32, bias [N] or None) with the
    weight's tiles copied by TMA, num_stages deep; block_k at most MAX_BLOCK_K."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if x.dim() != 2 or not 1 <= x.shape[0] <= fp8_gemv.MAX_ROWS:
        raise ValueError(f"fp8_gemv_tma takes 2-D x of 1 to {fp8_gemv.MAX_ROWS} rows, got "
                         f"{tuple(x.shape)}")
    if (block_k > MAX_BLOCK_K or weight.dim() != 2 or weight.shape[1] != x.shape[1]
            or not fp8_gemm_tma.fits(weight)):
        raise ValueError(f"fp8_gemv_tma takes block_k <= {MAX_BLOCK_K} and a weight [N, "
                         f"{x.shape[1]}] with 16-byte aligned rows, unit stride along K, got "
                         f"block_k {block_k}, weight {tuple(weight.shape)} strides "
                         f"{weight.stride()}")
    x = x if x.stride(1) == 1 else x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    grid = (triton.cdiv(n, block_n), split_k)
    y, parts, counters = split_tickets.outputs(m, n, x.dtype, x.device, split_k, grid[0],
                                               tickets)
    w_desc = TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [block_n, block_k])
    _fp8_gemv_tma_kernel[grid](
        x, w_desc, scale.reshape(-1), bias if bias is not None else scale, y,
        parts if parts is not None else y, counters if counters is not None else y, n, k,
        x.stride(0), y.stride(0), HAS_BIAS=bias is not None, ROWS=m,
        EVEN_K=k % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        NUM_STAGES=num_stages, TICKETS=counters is not None, num_warps=num_warps,
        **pdl.launch_options(x.device))
    return y.to(x.dtype)
