"""y = x (W * s)^T + b for one to four rows of x, W in FP8 E4M3 with one scale per output
row: a GEMV that streams W once (decode at batch 1-4).

A 16-row tl.dot wastes most of its tile at one row and spends registers and shuffles on
the operands' layouts; here each program reads a [BLOCK_N, BLOCK_K] FP8 tile per step (a
wide K step keeps many bytes in flight), widens it to fp32 and multiplies it by each of the
ROWS activation rows. A thread reads VEC = 8 weight bytes at a time, the width of its 16-byte
load of 16-bit activations, so the two share a layout (no shared-memory exchange in the
loop), and keeps the sums of its VEC products per row in registers, summed over threads
once after the loop (no shuffles in it). The scale (and bias) are applied at the end.
SPLIT_K > 1 gives small-N shapes more programs: each sums a part of K into an fp32 output
with atomic adds, or (TICKETS) stores it for the tile's last program to sum in split order
(split_tickets.py: no zeroing or cast kernel, the same bits run to run).

AHEAD (a config the choice by measurement may take, issue 60) keeps the next weight tile's
load in flight while the current one is multiplied (the tile held in the weight's dtype,
widened when used), and issues the first tile's load before the PDL wait: the weight is no
earlier kernel's output (as `pdl.start_streaming` assumes), so a program reads it during
the kernel before's tail, its activations only after the wait. (16-byte loads of E4M3,
VEC = 16, were tried: the tile then no longer shares the activations' layout, whose
16-byte loads hold 8 elements, and sm_90's PTX moves it through shared memory each step.)"""
import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import pdl, split_tickets
from parashift.kernels.silu_values import silu_mul_values

MAX_ROWS = 4
VEC = 8  # weight bytes a thread loads at once; BLOCK_K must be a multiple


@triton.jit
def _row_sums(w, x_row_ptr, k, k_ok, EVEN_K: tl.constexpr, VEC: tl.constexpr):
    """The tile times one activation row, summed over each VEC consecutive K (the bytes a
    thread loads at once, so the sums stay in a thread's registers):
    [BLOCK_N, BLOCK_K // VEC] fp32."""
    # loaded as [1, BLOCK_K]: in the tile's layout, where a [BLOCK_K] load would be moved
    # through shared memory every step
    if EVEN_K:
        x = tl.load(x_row_ptr + k[None, :])
    else:
        x = tl.load(x_row_ptr + k[None, :], mask=k_ok[None, :], other=0.0)
    prod = w * x.to(tl.float32)
    return tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // VEC, VEC)), axis=2)


@triton.jit
def _weight_tile(w_rows, k, k_ok, EVEN_K: tl.constexpr, EVICT_FIRST: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] weight tile at columns k, in the weight's dtype."""
    if EVEN_K:
        if EVICT_FIRST:
            return tl.load(w_rows + k[None, :], eviction_policy="evict_first")
        return tl.load(w_rows + k[None, :])
    if EVICT_FIRST:
        return tl.load(w_rows + k[None, :], mask=k_ok[None, :], other=0.0,
                       eviction_policy="evict_first")
    return tl.load(w_rows + k[None, :], mask=k_ok[None, :], other=0.0)


@triton.jit
def _tile_before(w_rows, k, k_end, EVICT_FIRST: tl.constexpr):
    """The weight tile at columns k, zeros (not loaded) at k_end and past: this program's
    part of K ends there (and K does, at the latest)."""
    if EVICT_FIRST:
        return tl.load(w_rows + k[None, :], mask=k[None, :] < k_end, other=0.0,
                       eviction_policy="evict_first")
    return tl.load(w_rows + k[None, :], mask=k[None, :] < k_end, other=0.0)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, N, K,
                     stride_xm, stride_wn, stride_ym, HAS_BIAS: tl.constexpr,
                     ROWS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, VEC: tl.constexpr,
                     USE_PDL: tl.constexpr, PREFETCH_K: tl.constexpr,
                     AHEAD: tl.constexpr = False, TICKETS: tl.constexpr = False,
                     LIBDEVICE: tl.constexpr = False,
                     SILU_OUT: tl.constexpr = False, EVICT_FIRST: tl.constexpr = False):
    first_n = tl.program_id(0) * BLOCK_N
    split = tl.program_id(1)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    first_k = split * k_per_split
    k_end = tl.minimum(K, first_k + k_per_split)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    if SILU_OUT:  # the tile's rows interleave gate row j and up row N / 2 + j
        pair = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2
        offs_n = tl.where(pair < N // 2, (tl.arange(0, BLOCK_N) % 2) * (N // 2) + pair, N)
    n_ok = offs_n < N
    # rows past N read row N-1 (in bounds, so the loads need no row mask); not stored
    w_rows = w_ptr + (offs_n % N)[:, None].to(tl.int64) * stride_wn
    offs_k = tl.max_contiguous(tl.arange(0, BLOCK_K), VEC)
    if AHEAD:  # the first tile before the wait: the weight is no earlier kernel's output
        w_next = _tile_before(w_rows, first_k + offs_k, k_end, EVICT_FIRST)
    else:  # unused: named for the compiler, which reads both branches of the loop's `if`
        w_next = tl.zeros((BLOCK_N, BLOCK_K), dtype=w_ptr.dtype.element_ty)
    pdl.start_streaming(w_ptr, stride_wn, N, K, first_n, first_k, BLOCK_N, PREFETCH_K,
                        USE_PDL)
    acc0 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    for k0 in range(first_k, k_end, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        if AHEAD:
            w = w_next.to(tl.float32)
            w_next = _tile_before(w_rows, k + BLOCK_K, k_end, EVICT_FIRST)
        else:
            w = _weight_tile(w_rows, k, k_ok, EVEN_K, EVICT_FIRST).to(tl.float32)
        acc0 += _row_sums(w, x_ptr, k, k_ok, EVEN_K, VEC)
        if ROWS > 1:
            acc1 += _row_sums(w, x_ptr + stride_xm, k, k_ok, EVEN_K, VEC)
        if ROWS > 2:
            acc2 += _row_sums(w, x_ptr + 2 * stride_xm, k, k_ok, EVEN_K, VEC)
        if ROWS > 3:
            acc3 += _row_sums(w, x_ptr + 3 * stride_xm, k, k_ok, EVEN_K, VEC)
    scale = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if HAS_BIAS:  # once: by split 0, or by the tile's last program (TICKETS)
        if TICKETS:
            bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        elif split == 0:
            bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    sums0, sums1 = tl.sum(acc0, axis=1), tl.sum(acc1, axis=1)
    sums2, sums3 = tl.sum(acc2, axis=1), tl.sum(acc3, axis=1)
    if TICKETS:
        _finish_by_tickets(y_ptr, stride_ym, part_ptr, counter_ptr, sums0, sums1, sums2, sums3,
                           scale, bias, offs_n, n_ok, N, split, ROWS, SPLIT_K)
    elif SILU_OUT:
        first_pair = tl.program_id(0) * (BLOCK_N // 2)
        _store_silu_rows(y_ptr + first_pair, stride_ym, sums0 * scale + bias,
                         sums1 * scale + bias, sums2 * scale + bias, sums3 * scale + bias,
                         N // 2 - first_pair, ROWS, LIBDEVICE)
    elif SPLIT_K == 1:
        _store_rows(y_ptr + offs_n, stride_ym, sums0 * scale + bias, sums1 * scale + bias,
                    sums2 * scale + bias, sums3 * scale + bias, n_ok, ROWS)
    else:
        _add_rows(y_ptr + offs_n, stride_ym, sums0 * scale + bias, sums1 * scale + bias,
                  sums2 * scale + bias, sums3 * scale + bias, n_ok, ROWS)


@triton.jit
def _finish_by_tickets(y_ptr, stride_ym, part_ptr, counter_ptr, sums0, sums1, sums2, sums3,
                       scale, bias, offs_n, n_ok, N, split, ROWS: tl.constexpr,
                       SPLIT_K: tl.constexpr):
    """Stores this program's part of each row's sums ([SPLIT_K, ROWS, N] fp32 parts); the
    tile's last program (split_tickets.py) sums the parts in split order and stores y."""
    plane = ROWS * N
    _store_rows(part_ptr + split * plane + offs_n, N, sums0, sums1, sums2, sums3, n_ok, ROWS)
    counter = counter_ptr + tl.program_id(0)
    if split_tickets.is_last(counter, SPLIT_K):
        split_tickets.reset(counter)
        parts = part_ptr + offs_n
        sums0 = split_tickets.summed_parts(parts, plane, n_ok, SPLIT_K)
        if ROWS > 1:
            sums1 = split_tickets.summed_parts(parts + N, plane, n_ok, SPLIT_K)
        if ROWS > 2:
            sums2 = split_tickets.summed_parts(parts + 2 * N, plane, n_ok, SPLIT_K)
        if ROWS > 3:
            sums3 = split_tickets.summed_parts(parts + 3 * N, plane, n_ok, SPLIT_K)
        _store_rows(y_ptr + offs_n, stride_ym, sums0 * scale + bias, sums1 * scale + bias,
                    sums2 * scale + bias, sums3 * scale + bias, n_ok, ROWS)


@triton.jit
def _store_rows(first_ptrs, stride, out0, out1, out2, out3, mask, ROWS: tl.constexpr):
    """The first ROWS of out0..out3 (fp32) in the dtype at first_ptrs, rows stride apart."""
    dtype = first_ptrs.dtype.element_ty
    tl.store(first_ptrs, out0.to(dtype), mask=mask)
    if ROWS > 1:
        tl.store(first_ptrs + stride, out1.to(dtype), mask=mask)
    if ROWS > 2:
        tl.store(first_ptrs + 2 * stride, out2.to(dtype), mask=mask)
    if ROWS > 3:
        tl.store(first_ptrs + 3 * stride, out3.to(dtype), mask=mask)


@triton.jit
def _silu_of_pairs(out, dtype, LIBDEVICE: tl.constexpr):
    """silu(gate) * up (fp32, [BLOCK_N // 2]) of out's interleaved (gate, up) pairs (fp32),
    each rounded to dtype first, as the unfused GEMV stores them for SiLU-and-mul."""
    gate, up = tl.split(tl.reshape(out.to(dtype), (out.shape[0] // 2, 2)))
    return silu_mul_values(gate, up, LIBDEVICE)


@triton.jit
def _store_silu_rows(first_ptrs, stride, out0, out1, out2, out3, count, ROWS: tl.constexpr,
                     LIBDEVICE: tl.constexpr):
    """`_store_rows` of the SiLU-and-mul of each row's (gate, up) pairs: `count` outputs at
    most."""
    dtype = first_ptrs.dtype.element_ty
    offs = tl.arange(0, out0.shape[0] // 2)
    mask = offs < count
    tl.store(first_ptrs + offs, _silu_of_pairs(out0, dtype, LIBDEVICE).to(dtype), mask=mask)
    if ROWS > 1:
        tl.store(first_ptrs + stride + offs, _silu_of_pairs(out1, dtype, LIBDEVICE).to(dtype),
                 mask=mask)
    if ROWS > 2:
        tl.store(first_ptrs + 2 * stride + offs,
                 _silu_of_pairs(out2, dtype, LIBDEVICE).to(dtype), mask=mask)
    if ROWS > 3:
        tl.store(first_ptrs + 3 * stride + offs,
                 _silu_of_pairs(out3, dtype, LIBDEVICE).to(dtype), mask=mask)


@triton.jit
def _add_rows(first_ptrs, stride, out0, out1, out2, out3, mask, ROWS: tl.constexpr):
    """`_store_rows` by atomic adds into fp32 (a part of K of several)."""
    tl.atomic_add(first_ptrs, out0, mask=mask, sem="relaxed")
    if ROWS > 1:
        tl.atomic_add(first_ptrs + stride, out1, mask=mask, sem="relaxed")
    if ROWS > 2:
        tl.atomic_add(first_ptrs + 2 * stride, out2, mask=mask, sem="relaxed")
    if ROWS > 3:
        tl.atomic_add(first_ptrs + 3 * stride, out3, mask=mask, sem="relaxed")


EVICT_ENV = "PARASHIFT_GEMV_EVICT_FIRST"


def evict_first() -> bool:
    """PARASHIFT_GEMV_EVICT_FIRST (1, the default, or 0; read at each launch, so a CUDA graph
    keeps what its capture read): the weight's loads marked evict-first in L2, so that a
    weight streamed once does not push out what the L2 prefetch (layers/l2_prefetch.py)
    pulled in for a later GEMM, nor the step's other reused lines. The same bits either way.
    On an H200 (8B FP8 decode b1, docs/benchmark_log.md, helper fp8g): the engine's step
    2.5992 against 2.6310 ms (1.012x, three interleaved rounds, each faster), the 32-layer
    chain 74.26 against 75.50 µs a layer."""
    return switch(EVICT_ENV, "1")


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor | None, block_n: int, block_k: int, num_warps: int,
             num_stages: int, split_k: int = 1, ahead: bool = False,
             tickets: bool = False, silu_out: bool = False) -> torch.Tensor:
    """x [M <= 4, K] (bf16/fp16/fp32), weight [N, K] E4M3 with unit stride along K (row
    slices of a wider buffer are fine), scale [N] or [N, 1] fp32, bias [N] or None; ahead:
    the next weight tile's load in flight while one is multiplied; tickets: split_k's parts
    summed by each tile's last program (split_tickets.py), not atomically; silu_out: the weight
    holds [gate; up] rows (N even) and the output is silu_and_mul of the product, [M, N / 2]
    (each program's tile interleaves gate and up rows; one part of K: split_k 1; the bits of
    the plain GEMV's output followed by silu_mul.silu_and_mul)."""
    if silu_out and (split_k != 1 or block_n % 2 or weight.shape[0] % 2):
        raise ValueError(f"fp8_gemv's silu_out takes an even block_n and weight rows and one "
                         f"part of K, got block_n {block_n}, split_k {split_k}, weight "
                         f"{tuple(weight.shape)}")
    if block_k % VEC:
        raise ValueError(f"fp8_gemv's block_k must be a multiple of {VEC}, got {block_k}")
    k = weight.shape[1] if weight.dim() == 2 else -1
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"fp8_gemv takes 2-D x of 1 to {MAX_ROWS} rows, got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.stride(1) != 1 or x.shape[1] != k:
        raise ValueError(f"fp8_gemv of x {tuple(x.shape)} needs a weight [N, {x.shape[1]}] "
                         f"contiguous along K, got {tuple(weight.shape)} with strides "
                         f"{weight.stride()}")
    x = x if x.stride(1) == 1 else x.contiguous()
    m, n = x.shape[0], weight.shape[0]
    grid = (triton.cdiv(n // 2 if silu_out else n, block_n // 2 if silu_out else block_n),
            split_k)
    y, parts, counters = split_tickets.outputs(m, n // 2 if silu_out else n, x.dtype,
                                               x.device, split_k, grid[0], tickets)
    _fp8_gemv_kernel[grid](
        x, weight, scale.reshape(-1), bias if bias is not None else scale, y,
        parts if parts is not None else y, counters if counters is not None else y,
        n, k, x.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, ROWS=m,
        EVEN_K=k % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, VEC=VEC,
        AHEAD=ahead, TICKETS=counters is not None, SILU_OUT=silu_out,
        LIBDEVICE=silu_out and x.is_cuda, EVICT_FIRST=evict_first(),
        num_warps=num_warps, num_stages=num_stages,
        **pdl.launch_options(x.device, (block_n, k, weight.element_size())))
    return y.to(x.dtype)
