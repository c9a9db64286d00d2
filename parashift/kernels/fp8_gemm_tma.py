"""The FP8-weight GEMM at 16-64 rows with the weight streamed by TMA (sm_90 tensor
descriptors), the product taken as y^T = W x^T (issue 60).

`fp8_gemm.py`'s kernel multiplies x [M, K] by W^T, so wgmma's 64-row side is the tokens':
at 16-32 rows most of it is padding, and the widened weight ("w8") goes through shared
memory again as the B operand. Here each program's tile is [BLOCK_N weight rows, BLOCK_M
tokens]: the weight is wgmma's A operand (64 or 128 rows a warpgroup), widened in
registers where the activations are 16-bit, and the tokens are its N side (16-64). Both
operands come by TMA (`TensorDescriptor`s made on the host; out of bounds reads as zeros,
so no masks in the loop), pipelined NUM_STAGES deep. The K split by tickets
(split_tickets.py) gives N = 4096 several waves of programs."""
import functools
import os

import torch
import triton
import triton.language as tl

from parashift.kernels import pdl, split_tickets
from parashift.kernels.fp8_epilogue import finish_split_tile

KERNELS = ("tma_w8", "tma_w8a8")  # fp8_gemm.Config.kernel values of this file
MAX_BLOCK_K = 256  # a TMA box's dimension
ENV, DEFAULT = "PARASHIFT_FP8_TMA", "0"


def enabled() -> bool:
    """Whether `fp8_gemm.linear` measures these kernels (PARASHIFT_FP8_TMA: 0 or 1)."""
    flag = os.environ.get(ENV, DEFAULT)
    if flag not in ("0", "1"):
        raise ValueError(f"{ENV}={flag!r}: expected 0 or 1")
    return flag == "1"


def takes(weight: torch.Tensor) -> bool:
    """The kernels run on this device and the weight's layout suits TMA (`fits`)."""
    return supported(weight.device) and fits(weight)


@functools.cache
def supported(device: torch.device) -> bool:
    """This Triton has host tensor descriptors and the device TMA (sm_90+); under the
    Triton interpreter (CPU tests) the descriptors are emulated."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] >= 9


def fits(t: torch.Tensor) -> bool:
    """TMA's layout rules for a 2-D operand: a 16-byte aligned base and row stride, unit
    stride along K."""
    return (t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0)


@triton.jit
def _fp8_tma_kernel(x_desc, xs_ptr, w_desc, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, M, N,
                    K, stride_ym, HAS_BIAS: tl.constexpr, FP8_X: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, TICKETS: tl.constexpr, NUM_STAGES: tl.constexpr,
                    USE_PDL: tl.constexpr):
    first_n = tl.program_id(0) * BLOCK_N
    first_m = tl.program_id(1) * BLOCK_M
    split = tl.program_id(2)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_end = tl.minimum(K, (split + 1) * k_per_split)
    pdl.start(USE_PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(split * k_per_split, k_end, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([first_n, k0])
        x = x_desc.load([first_m, k0])
        if FP8_X:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc)
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    finish_split_tile(tl.trans(acc), xs_ptr, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, M, N,
                      stride_ym, offs_m, offs_n, offs_m < M, offs_n < N, split,
                      tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), HAS_BIAS,
                      FP8_X, SPLIT_K, TICKETS, USE_PDL)


def block_m(rows: int) -> int:
    """The tokens a tile takes: wgmma's N side, 16 at the least (tl.dot's)."""
    return max(16, min(64, triton.next_power_of_2(rows)))


def tma_linear(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
               scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
               block_n: int, block_k: int, num_warps: int, num_stages: int, split_k: int,
               tickets: bool) -> torch.Tensor:
    """y [M, N] in out_dtype = x (weight * scale)^T + bias; x [M, K] 16-bit (the weight
    widened to its dtype) or E4M3 with x_scale [M, 1] fp32 (per token)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if block_k > MAX_BLOCK_K or not fits(weight):
        raise ValueError(f"the TMA FP8 GEMM takes BLOCK_K <= {MAX_BLOCK_K} and a weight with "
                         f"16-byte aligned rows, got BLOCK_K {block_k}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}")
    x = x if fits(x) else x.clone(memory_format=torch.contiguous_format)
    (m, k), n = x.shape, weight.shape[0]
    bm = block_m(m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, bm), split_k)
    y, parts, counters = split_tickets.outputs(m, n, out_dtype, x.device, split_k,
                                               grid[0] * grid[1], tickets)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, block_k])
    w_desc = _weight_descriptor(weight, block_n, block_k)
    _fp8_tma_kernel[grid](
        x_desc, x_scale, w_desc, scale.reshape(-1), bias if bias is not None else scale, y,
        parts if parts is not None else y, counters if counters is not None else y, m, n, k,
        y.stride(0), HAS_BIAS=bias is not None, FP8_X=x.dtype == weight.dtype, BLOCK_M=bm,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, TICKETS=counters is not None,
        NUM_STAGES=num_stages, num_warps=num_warps, **pdl.launch_options(x.device))
    return y.to(out_dtype)


def _weight_descriptor(weight: torch.Tensor, block_n: int, block_k: int):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1],
                            [block_n, block_k])
