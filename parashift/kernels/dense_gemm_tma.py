"""The 16-bit GEMM of decode at 33-64 rows with the weight streamed by TMA, the product
taken as y^T = W x^T (issue 61: 8B bf16 decode at 64 and 256 rows).

Each program's tile is [BLOCK_N weight rows, BLOCK_M tokens]: the weight is wgmma's A
operand (64 rows a warpgroup), the tokens its N side. Both operands come by TMA
(`TensorDescriptor`s made on the host; out of bounds reads as zeros, so no masks in the
loop), pipelined NUM_STAGES deep. Under PDL each program loads its bias (no earlier kernel
writes it) before its grid wait, while the kernel before (a norm, SiLU·mul, attention) runs
(pulling the start of its weight slice into L2 there too was 0.2-2% slower at the 8B's
shapes at 64 rows: removed). The row tiles of one column
tile are launched next to each other (grid axis 0), so with row tiles narrower than the
rows a weight tile read by one is in L2 for the others. K may be split in parts summed by tickets
(split_tickets.py) where N gives too few column tiles. fp8_gemm_tma.py is the FP8-weight
kernel this follows; its `fits` and weight descriptor are shared."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets
from parashift.kernels.fp8_epilogue import finish_split_tile, store_part
from parashift.kernels.fp8_gemm_tma import MAX_BLOCK_K, _weight_descriptor, fits, supported

FP8_X = tl.constexpr(False)  # finish_split_tile's: the tokens carry no scales here


@dataclass(frozen=True)
class Config:
    block_n: int  # weight rows a tile (wgmma's M: 64 a warpgroup)
    block_m: int  # tokens a tile (wgmma's N)
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # parts of K, summed by tickets


def takes(weight: torch.Tensor) -> bool:
    """The kernel runs on this device and the weight's layout suits TMA."""
    return supported(weight.device) and fits(weight)


@triton.jit
def _dense_tma_kernel(x_desc, w_desc, b_ptr, y_ptr, part_ptr, counter_ptr,
                      M, N, K, stride_ym, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      TICKETS: tl.constexpr, NUM_STAGES: tl.constexpr,
                      USE_PDL: tl.constexpr, PARTS_OUT: tl.constexpr = False):
    """One program a (row tile, column tile, part of K); parts of K summed by tickets
    (TICKETS) or added atomically to the fp32 y, or (PARTS_OUT) each stored into part_ptr's
    planes for the op after to sum (`tma_parts`)."""
    first_m = tl.program_id(0) * BLOCK_M
    first_n = tl.program_id(1) * BLOCK_N
    split = tl.program_id(2)
    k_steps = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if HAS_BIAS:  # a weight: no kernel before writes it
        bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    pdl.start(USE_PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(split * k_steps, tl.minimum((split + 1) * k_steps, tl.cdiv(K, BLOCK_K)),
                         num_stages=NUM_STAGES):
        w = w_desc.load([first_n, step * BLOCK_K])
        x = x_desc.load([first_m, step * BLOCK_K])
        acc = tl.dot(w, tl.trans(x), acc)
    if PARTS_OUT:
        store_part(tl.trans(acc), part_ptr, M, N, offs_m, offs_n, m_ok, n_ok, split, USE_PDL)
    else:
        ones = tl.full((BLOCK_N,), 1.0, tl.float32)  # the weight scale finish_split_tile takes
        finish_split_tile(tl.trans(acc), (ones, ones, bias), y_ptr, part_ptr, counter_ptr, M,
                          N, stride_ym, offs_m, offs_n, m_ok, n_ok, split,
                          tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), HAS_BIAS,
                          FP8_X, SPLIT_K, TICKETS, USE_PDL)


def tma_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               config: Config) -> torch.Tensor:
    """y [M, N] = x weight^T + bias in x's dtype; x [M, K] and weight [N, K] 16-bit, the
    weight with unit stride along K and 16-byte aligned rows (row slices of a larger weight
    are fine), bias [N] or None."""
    x = _checked(x, weight, config)
    m, n = x.shape[0], weight.shape[0]
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    y, parts, counters = split_tickets.outputs(m, n, x.dtype, x.device, config.split_k, tiles,
                                               True)
    _launch(x, weight, bias, y, parts, counters, config)
    return y.to(x.dtype)


def tma_parts(x: torch.Tensor, weight: torch.Tensor, config: Config) -> torch.Tensor:
    """parts [config.split_k, M, N] fp32: x weight^T over each part of K (no tickets: the op
    after sums them in part order, then adds what the ticket path's last program adds,
    kernels/parts_rmsnorm.py); x and weight as `tma_linear` takes them."""
    x = _checked(x, weight, config)
    parts = torch.empty(config.split_k, x.shape[0], weight.shape[0], dtype=torch.float32,
                        device=x.device)
    _launch(x, weight, None, parts, parts, None, config, parts_out=True)
    return parts


def _checked(x: torch.Tensor, weight: torch.Tensor, config: Config) -> torch.Tensor:
    """x with TMA's layout (a copy where it lacks it); a weight without it is refused."""
    if config.block_k > MAX_BLOCK_K or not fits(weight) or x.dtype != weight.dtype:
        raise ValueError(f"the dense TMA GEMM takes BLOCK_K <= {MAX_BLOCK_K} and a weight of "
                         f"x's dtype with 16-byte aligned rows, got BLOCK_K {config.block_k}, "
                         f"x {x.dtype}, weight {weight.dtype} {tuple(weight.shape)} strides "
                         f"{weight.stride()}")
    return x if fits(x) else x.clone(memory_format=torch.contiguous_format)


def _launch(x, weight, bias, y, parts, counters, config, parts_out=False):
    from triton.tools.tensor_descriptor import TensorDescriptor
    (m, k), n = x.shape, weight.shape[0]
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), config.split_k)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [config.block_m, config.block_k])
    options = pdl.launch_options(x.device)
    if parts_out:
        options["PARTS_OUT"] = True
    _dense_tma_kernel[grid](
        x_desc, _weight_descriptor(weight, config.block_n, config.block_k),
        bias if bias is not None else weight, y,
        parts if parts is not None else y, counters if counters is not None else y, m, n, k,
        y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, SPLIT_K=config.split_k, TICKETS=counters is not None,
        NUM_STAGES=config.num_stages, num_warps=config.num_warps, **options)
