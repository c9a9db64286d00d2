"""gate_up with SiLU-and-mul in its epilogue at 16-64 rows (FP8 decode, issue 60): the TMA FP8 x
FP8 GEMM of fp8_gemm_tma.py (y^T = W x^T) where each program takes BLOCK_N gate rows and the
same BLOCK_N up rows (HALF further), multiplies both by the tokens' tile, and stores
silu(gate) * up [M, HALF] instead of [gate | up] [M, 2 HALF].

Each product is summed along K as `_fp8_tma_kernel` sums it at the same BLOCK_K (one part of
K), scaled and rounded to the activations' dtype as its epilogue rounds them, and the
product formed and rounded as silu_mul.silu_and_mul rounds it: the bits of that kernel's
config of the same BLOCK_K, tokens a tile and no K split followed by SiLU-and-mul.

The rows' FP8 quantization for down is a kernel of its own: `fp8_gemm.quantize_rows`, or
(`gated_linear(..., part_max=True)` then `quantize_by_parts`) each program also stores its
tile's largest magnitude a row, and the quantization takes the row's scale from those and
spreads each row over many programs, with no pass of its own for the largest. Both are
`quantize_rows`' bits (a largest magnitude is exact in any order)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import fp8_gemm_tma, pdl
from parashift.kernels.fp8_gemm import FP8, FP8_MAX, row_scale, to_fp8
from parashift.kernels.gated_tma import gate_and_up
from parashift.kernels.silu_values import silu_mul_values

QUANT_BLOCK, QUANT_WARPS = 2048, 4  # quantize_by_parts: columns a program (16 a thread)


@triton.jit
def _gated_tma_kernel(x_desc, xs_ptr, w_desc, w_ptr, stride_wn, s_ptr, y_ptr, max_ptr, M, HALF,
                      K, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                      LIBDEVICE: tl.constexpr, USE_PDL: tl.constexpr,
                      PREFETCH_K: tl.constexpr, PART_MAX: tl.constexpr = False):
    """One program a (gate column tile, token tile); PREFETCH_K: the first columns of its
    gate and up rows pulled into L2 before the PDL wait; PART_MAX: the tile's largest
    magnitude a row stored at max_ptr [M, column tiles]."""
    first_n = tl.program_id(0) * BLOCK_N
    first_m = tl.program_id(1) * BLOCK_M
    if USE_PDL and PREFETCH_K > 0:  # a gate tile past HALF prefetches up rows: harmless
        pdl.prefetch_rows(w_ptr + first_n.to(tl.int64) * stride_wn, stride_wn, 2 * HALF - first_n,
                          K, BLOCK_N, PREFETCH_K)
        pdl.prefetch_rows(w_ptr + (HALF + first_n).to(tl.int64) * stride_wn, stride_wn,
                          HALF - first_n, K, BLOCK_N, PREFETCH_K)
    pdl.start(USE_PDL)
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < HALF
    x_scale = tl.load(xs_ptr + offs_m, mask=m_ok, other=0.0)
    gate_scale = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)
    up_scale = tl.load(s_ptr + HALF + offs_n, mask=n_ok, other=0.0)
    gate, up = gate_and_up(x_desc, w_desc, first_m, first_n, HALF, K, BLOCK_M, BLOCK_N,
                           BLOCK_K, NUM_STAGES)
    out_ty = y_ptr.dtype.element_ty
    gate = _scaled(tl.trans(gate), gate_scale, x_scale).to(out_ty)
    up = _scaled(tl.trans(up), up_scale, x_scale).to(out_ty)
    product = silu_mul_values(gate, up, LIBDEVICE).to(out_ty)
    pdl.inputs_read(USE_PDL)
    y = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y, product, mask=m_ok[:, None] & n_ok[None, :])
    if PART_MAX:  # columns past HALF hold silu(0) * 0 = 0
        largest = tl.max(tl.abs(product.to(tl.float32)), axis=1)
        tl.store(max_ptr + offs_m * tl.num_programs(0) + tl.program_id(0), largest, mask=m_ok)


@triton.jit
def _quantize_by_parts_kernel(y_ptr, max_ptr, q_ptr, s_ptr, d, parts, FP8_MAX: tl.constexpr,
                              PARTS: tl.constexpr, BLOCK: tl.constexpr,
                              USE_PDL: tl.constexpr):
    """Program (row, column block): the row's scale from its parts' largest magnitudes, its
    block's E4M3 values (as _quantize_rows_kernel's); the first block stores the scale."""
    pdl.start(USE_PDL)
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    p = tl.arange(0, PARTS)
    part_max = tl.load(max_ptr + row * parts + p, mask=p < parts, other=0.0)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(y_ptr + row * d + cols, mask=cols < d, other=0.0).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    scale = row_scale(tl.max(part_max, axis=0), FP8_MAX)
    to_fp8(values, scale, q_ptr + row * d + cols, cols < d, FP8_MAX)
    if block == 0:
        tl.store(s_ptr + row, scale)


@triton.jit
def _scaled(acc, w_scale, x_scale):
    """acc [BLOCK_M, BLOCK_N] scaled as fp8_epilogue.finish_tile scales it (weight rows,
    then tokens)."""
    acc *= w_scale[None, :]
    acc *= x_scale[:, None]
    return acc


def gated_linear(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                 scale: torch.Tensor, out_dtype: torch.dtype, block_n: int, block_k: int,
                 num_warps: int, num_stages: int, max_block_m: int = 0,
                 part_max: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """silu_and_mul(xq (weight * scale)^T) [M, HALF] in out_dtype: xq [M, K] E4M3 with
    x_scale [M, 1] fp32 (per token), weight [2 HALF, K] E4M3 ([gate; up]) with scale
    [2 HALF] or [2 HALF, 1]; block_n gate rows (and as many up rows) a program;
    max_block_m: the most tokens a tile takes (fp8_gemm_tma.block_m). part_max: (that, each
    row's largest magnitude a column tile, fp32 [M, tiles]) for `quantize_by_parts`."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if weight.shape[0] % 2 or block_k > fp8_gemm_tma.MAX_BLOCK_K or \
            not fp8_gemm_tma.fits(weight) or xq.dtype != weight.dtype:
        raise ValueError(f"gated_linear takes E4M3 rows, a [gate; up] E4M3 weight of even "
                         f"rows with 16-byte aligned rows and BLOCK_K <= "
                         f"{fp8_gemm_tma.MAX_BLOCK_K}, got x {xq.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} strides {weight.stride()}, "
                         f"BLOCK_K {block_k}")
    xq = xq if fp8_gemm_tma.fits(xq) else xq.clone(memory_format=torch.contiguous_format)
    (m, k), half = xq.shape, weight.shape[0] // 2
    bm = fp8_gemm_tma.block_m(m, max_block_m)
    y = torch.empty(m, half, dtype=out_dtype, device=xq.device)
    tiles = triton.cdiv(half, block_n)
    largest = torch.empty(m, tiles, dtype=torch.float32, device=xq.device) if part_max else y
    x_desc = TensorDescriptor(xq, [m, k], [xq.stride(0), 1], [bm, block_k])
    w_desc = TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1],
                              [block_n, block_k])
    options = pdl.launch_options(xq.device)
    options["PREFETCH_K"] = (pdl.prefetch_cols(2 * block_n, k, 1, fp8_gemm_tma.prefetch_bytes())
                             if options["USE_PDL"] else 0)
    _gated_tma_kernel[(tiles, triton.cdiv(m, bm))](
        x_desc, x_scale.reshape(-1), w_desc, weight, weight.stride(0), scale.reshape(-1), y,
        largest, m, half, k, y.stride(0), BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k,
        NUM_STAGES=num_stages, LIBDEVICE=xq.is_cuda, PART_MAX=part_max, num_warps=num_warps,
        enable_fp_fusion=False, **options)
    return (y, largest) if part_max else y


def quantize_by_parts(y: torch.Tensor, part_max: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(y's rows in E4M3, fp32 scales [M, 1]) as `fp8_gemm.quantize_rows(y)` makes them, of a
    contiguous y [M, d] and its rows' largest magnitudes by parts [M, parts]."""
    (m, d), parts = y.shape, part_max.shape[1]
    q = torch.empty(m, d, dtype=FP8, device=y.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=y.device)
    _quantize_by_parts_kernel[(m, triton.cdiv(d, QUANT_BLOCK))](
        y, part_max, q, scale, d, parts, FP8_MAX=FP8_MAX,
        PARTS=triton.next_power_of_2(parts), BLOCK=QUANT_BLOCK, num_warps=QUANT_WARPS,
        **pdl.launch_options(y.device))
    return q, scale
