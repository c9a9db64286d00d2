"""The FP8-weight GEMM at 16-64 rows with the weight streamed by TMA (sm_90 tensor
descriptors), the product taken as y^T = W x^T (issue 60).

`fp8_gemm.py`'s kernel multiplies x [M, K] by W^T, so wgmma's 64-row side is the tokens':
at 16-32 rows most of it is padding, and the widened weight ("w8") goes through shared
memory again as the B operand. Here each program's tile is [BLOCK_N weight rows, BLOCK_M
tokens]: the weight is wgmma's A operand (64 or 128 rows a warpgroup), widened in
registers where the activations are 16-bit, and the tokens are its N side (16-64). Both
operands come by TMA (`TensorDescriptor`s made on the host; out of bounds reads as zeros,
so no masks in the loop), pipelined NUM_STAGES deep. The K split by tickets
(split_tickets.py) gives N = 4096 several waves of programs. The persistent kernel runs a
program an SM over the (tile, part of K) items. `fp8_epilogue.py` finishes the tiles, as
for `fp8_gemm.py`'s kernel. On an H200 (docs/benchmark_log.md) E4M3 x E4M3 ("tma_w8a8") beat
`fp8_gemm.py`'s best at 11 of the 8B's 12 projection/row shapes (up to 1.19x); the widening
kernels (the conversion is their bound) and the persistent one lost everywhere, and are kept
for `benchmarks/fp8_gemm_sweep.py`."""
import functools
import os

import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import num_sms, pdl, split_tickets
from parashift.kernels.fp8_epilogue import early_scales, finish_split_tile, store_part, \
    tile_scales

# fp8_gemm.Config.kernel values of this file: w8 widens the weight (the compiler's
# conversions; w8bits: `_bf16_of_e4m3`'s integer ops, bf16 activations), w8a8 takes E4M3
# activations; "_p": the persistent kernel
KERNELS = tuple(f"tma_{kind}{persistent}" for persistent in ("", "_p")
                for kind in ("w8", "w8bits", "w8a8"))
MAX_BLOCK_K = 256  # a TMA box's dimension
ENV, DEFAULT = "PARASHIFT_FP8_TMA", "1"
PREFETCH_ENV, DEFAULT_PREFETCH_KB = "PARASHIFT_FP8_TMA_PREFETCH_KB", "64"


def enabled() -> bool:
    """Whether `fp8_gemm.linear` measures these kernels (PARASHIFT_FP8_TMA: 0 or 1)."""
    return switch(ENV, DEFAULT)


def prefetch_bytes() -> int:
    """PARASHIFT_FP8_TMA_PREFETCH_KB in bytes (read at each launch; a CUDA graph keeps what
    its capture read): what of its weight slice each program of `_fp8_tma_kernel` pulls into
    L2 before its PDL wait, while the kernel before (a norm, SiLU·mul or the per-token
    quantization: few programs) still runs. Only under PDL; 0: none; 64 by default (one
    H200, 8B FP8 layers at 64 rows in the decode chain: 1.0099x a layer, 128 KB 1.012x;
    docs/benchmark_log.md, helper fp8b64)."""
    value = os.environ.get(PREFETCH_ENV, DEFAULT_PREFETCH_KB)
    if not value.isdigit():
        raise ValueError(f"{PREFETCH_ENV}={value!r}: expected a whole number of KB (0: none)")
    return int(value) * 1024


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
def _fp8_tma_kernel(x_desc, xs_ptr, w_desc, w_ptr, stride_wn, s_ptr, b_ptr, y_ptr, part_ptr,
                    counter_ptr, M, N, K, stride_ym, HAS_BIAS: tl.constexpr,
                    FP8_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, TICKETS: tl.constexpr,
                    NUM_STAGES: tl.constexpr, BIT_WIDEN: tl.constexpr, USE_PDL: tl.constexpr,
                    PREFETCH_K: tl.constexpr, EARLY_SCALES: tl.constexpr,
                    PARTS_OUT: tl.constexpr = False):
    """One program a (column tile, row tile, part of K); PREFETCH_K: the first columns of
    its weight slice pulled into L2 before the PDL wait (`prefetch_bytes`); EARLY_SCALES:
    the tile's scales and bias loaded before the main loop; PARTS_OUT: each part stored
    unscaled into part_ptr's planes, left for the op after to sum (`tma_parts`)."""
    first_n = tl.program_id(0) * BLOCK_N
    first_m = tl.program_id(1) * BLOCK_M
    split = tl.program_id(2)
    k_steps = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    pdl.start_streaming(w_ptr, stride_wn, N, K, first_n, split * k_steps * BLOCK_K, BLOCK_N,
                        PREFETCH_K, USE_PDL)
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    if EARLY_SCALES:
        scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, offs_m < M, offs_n < N,
                             HAS_BIAS, FP8_X)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(split * k_steps, tl.minimum((split + 1) * k_steps, tl.cdiv(K, BLOCK_K)),
                         num_stages=NUM_STAGES):
        acc = _dot_step(w_desc, x_desc, first_n, first_m, step * BLOCK_K, acc, FP8_X,
                        BIT_WIDEN)
    if PARTS_OUT:
        store_part(tl.trans(acc), part_ptr, M, N, offs_m, offs_n, offs_m < M, offs_n < N,
                   split, USE_PDL)
    else:
        if not EARLY_SCALES:
            scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, offs_m < M, offs_n < N,
                                 HAS_BIAS, FP8_X)
        _finish(acc, scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym, offs_m, offs_n,
                split, tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), HAS_BIAS,
                FP8_X, SPLIT_K, TICKETS, USE_PDL)


@triton.jit
def _fp8_tma_persistent_kernel(x_desc, xs_ptr, w_desc, s_ptr, b_ptr, y_ptr, part_ptr,
                               counter_ptr, M, N, K, stride_ym, HAS_BIAS: tl.constexpr,
                               FP8_X: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               SPLIT_K: tl.constexpr, TICKETS: tl.constexpr,
                               NUM_STAGES: tl.constexpr, BIT_WIDEN: tl.constexpr,
                               USE_PDL: tl.constexpr):
    """A program an SM, over the (tile, part of K) items one grid's width apart: no wave
    quantization; with one part (or parts summed atomically) the loops are flattened, the
    weight stream pipelined across items. K split as `_fp8_tma_kernel` splits it (a part
    past K reads zeros)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_n * tl.cdiv(M, BLOCK_M)
    k_steps = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    pdl.start(USE_PDL)
    # flattened with the tickets' barrier and acquire the loop is not pipelined at all:
    # there each item's K loop is pipelined on its own
    for item in tl.range(tl.program_id(0), tiles * SPLIT_K, tl.num_programs(0),
                         num_stages=NUM_STAGES, flatten=not TICKETS):
        split, tile = item // tiles, item % tiles
        first_n, first_m = (tile % tiles_n) * BLOCK_N, (tile // tiles_n) * BLOCK_M
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for step in range(k_steps):
            acc = _dot_step(w_desc, x_desc, first_n, first_m, (split * k_steps + step) * BLOCK_K,
                            acc, FP8_X, BIT_WIDEN)
        offs_m = first_m + tl.arange(0, BLOCK_M)
        offs_n = first_n + tl.arange(0, BLOCK_N)
        scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, offs_m < M, offs_n < N,
                             HAS_BIAS, FP8_X)
        _finish(acc, scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym, offs_m, offs_n,
                split, tile, HAS_BIAS, FP8_X, SPLIT_K, TICKETS, USE_PDL)


@triton.jit
def _dot_step(w_desc, x_desc, first_n, first_m, k0, acc, FP8_X: tl.constexpr,
              BIT_WIDEN: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += the weight tile at (first_n, k0) times the tokens' tile at
    (first_m, k0) transposed, out-of-bounds parts read as zeros."""
    w = w_desc.load([first_n, k0])
    x = x_desc.load([first_m, k0])
    if FP8_X:
        return tl.dot(w, tl.trans(x), acc)
    if BIT_WIDEN:
        return tl.dot(_bf16_of_e4m3(w), tl.trans(x), acc)
    return tl.dot(w.to(x.dtype), tl.trans(x), acc)


# E4M3 to bf16, four at a time: each byte's 7 magnitude bits shifted into bf16's exponent and
# mantissa fields read as 2^-120 times the value (E4M3's subnormals as bf16's), times 2^120
# (exact), the sign put back. sm_90 has no E4M3 -> bf16 cvt: the compiler's E4M3 -> f16 ->
# bf16 costs three conversions a pair at the conversion units' lower rate. E4M3's NaN
# (never a quantized weight: they are clamped to 448) reads as 480.
_BF16_OF_E4M3 = tl.constexpr("""{
.reg .b32 lo, hi, slo, shi, pow, zero;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
shl.b32 slo, lo, 8;
shl.b32 shi, hi, 8;
and.b32 slo, slo, 0x80008000;
and.b32 shi, shi, 0x80008000;
shl.b32 lo, lo, 4;
shl.b32 hi, hi, 4;
and.b32 lo, lo, 0x07F007F0;
and.b32 hi, hi, 0x07F007F0;
mov.b32 pow, 0x7B807B80;
mov.b32 zero, 0;
fma.rn.bf16x2 lo, lo, pow, zero;
fma.rn.bf16x2 hi, hi, pow, zero;
or.b32 $0, lo, slo;
or.b32 $1, hi, shi;
}""")


@triton.jit
def _bf16_of_e4m3(w):
    return tl.inline_asm_elementwise(_BF16_OF_E4M3, "=r,=r,r", [w.to(tl.uint8, bitcast=True)],
                                     dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _finish(acc, scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym, offs_m, offs_n, split,
            tile, HAS_BIAS: tl.constexpr, FP8_X: tl.constexpr, SPLIT_K: tl.constexpr,
            TICKETS: tl.constexpr, USE_PDL: tl.constexpr):
    finish_split_tile(tl.trans(acc), scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym,
                      offs_m, offs_n, offs_m < M, offs_n < N, split, tile, HAS_BIAS, FP8_X,
                      SPLIT_K, TICKETS, USE_PDL)


def block_m(rows: int, most: int = 0) -> int:
    """The tokens a tile takes: wgmma's N side, 16 at the least (tl.dot's), at most `most`
    where given (0: 64)."""
    return max(16, min(most or 64, triton.next_power_of_2(rows)))


def tma_linear(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
               scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
               block_n: int, block_k: int, num_warps: int, num_stages: int, split_k: int,
               tickets: bool, persistent: bool = False, bit_widen: bool = False,
               max_block_m: int = 0) -> torch.Tensor:
    """y [M, N] in out_dtype = x (weight * scale)^T + bias; x [M, K] 16-bit (the weight
    widened to its dtype; bit_widen: by integer ops where x is bf16, compiled) or E4M3 with
    x_scale [M, 1] fp32 (per token); persistent: a program an SM over the (tile, part of K)
    items; max_block_m: the most tokens a tile takes (`block_m`)."""
    x = _checked(x, weight, block_k)
    m, n = x.shape[0], weight.shape[0]
    bm = block_m(m, max_block_m)
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, bm)
    y, parts, counters = split_tickets.outputs(m, n, out_dtype, x.device, split_k, tiles,
                                               tickets)
    _launch(x, x_scale, weight, scale, bias, y, parts, counters, bm, block_n, block_k,
            num_warps, num_stages, split_k, persistent, bit_widen)
    return y.to(out_dtype)


def tma_parts(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block_n: int,
              block_k: int, num_warps: int, num_stages: int, split_k: int,
              max_block_m: int = 0) -> torch.Tensor:
    """parts [split_k, M, N] fp32: x weight^T over each of split_k parts of K, unscaled
    (no tickets: the op after sums them in part order and applies the scales as the ticket
    path's last program does, kernels/parts_rmsnorm.py); x [M, K] E4M3."""
    x = _checked(x, weight, block_k)
    m, n = x.shape[0], weight.shape[0]
    parts = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
    _launch(x, scale, weight, scale, None, parts, parts, None, block_m(m, max_block_m),
            block_n, block_k, num_warps, num_stages, split_k, False, False, parts_out=True)
    return parts


def _checked(x: torch.Tensor, weight: torch.Tensor, block_k: int) -> torch.Tensor:
    """x with TMA's layout (a copy where it lacks it); a weight without it is refused."""
    if block_k > MAX_BLOCK_K or not fits(weight):
        raise ValueError(f"the TMA FP8 GEMM takes BLOCK_K <= {MAX_BLOCK_K} and a weight with "
                         f"16-byte aligned rows, got BLOCK_K {block_k}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}")
    return x if fits(x) else x.clone(memory_format=torch.contiguous_format)


def _launch(x, x_scale, weight, scale, bias, y, parts, counters, bm, block_n, block_k,
            num_warps, num_stages, split_k, persistent, bit_widen, parts_out=False):
    from triton.tools.tensor_descriptor import TensorDescriptor
    (m, k), n = x.shape, weight.shape[0]
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, bm)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, block_k])
    w_desc = _weight_descriptor(weight, block_n, block_k)
    options = pdl.launch_options(x.device)
    if persistent:
        kernel, grid = _fp8_tma_persistent_kernel, (min(tiles * split_k, num_sms(x.device)),)
        weight_args = (w_desc,)
    else:
        kernel, grid = _fp8_tma_kernel, (triton.cdiv(n, block_n), triton.cdiv(m, bm), split_k)
        weight_args = (w_desc, weight, weight.stride(0))
        options["PREFETCH_K"] = (pdl.prefetch_cols(block_n, triton.cdiv(k, split_k), 1,
                                                   prefetch_bytes())
                                 if options["USE_PDL"] else 0)
        options["EARLY_SCALES"] = early_scales(bias is not None)
        if parts_out:
            options["PARTS_OUT"] = True
    bit_widen = bit_widen and x.dtype == torch.bfloat16 and not _interpreted()
    kernel[grid](
        x_desc, x_scale, *weight_args, scale.reshape(-1), bias if bias is not None else scale,
        y, parts if parts is not None else y, counters if counters is not None else y, m, n,
        k, y.stride(0), HAS_BIAS=bias is not None, FP8_X=x.dtype == weight.dtype, BLOCK_M=bm,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, TICKETS=counters is not None,
        NUM_STAGES=num_stages, BIT_WIDEN=bit_widen, num_warps=num_warps, **options)


def _interpreted() -> bool:  # the Triton interpreter runs no inline PTX
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _weight_descriptor(weight: torch.Tensor, block_n: int, block_k: int):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1],
                            [block_n, block_k])
