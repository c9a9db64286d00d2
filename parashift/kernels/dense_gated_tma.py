"""16-bit gate_up with SiLU-and-mul in its epilogue at 33-64 rows (bf16 decode, issue 61): the
TMA GEMM of dense_gemm_tma.py (y^T = W x^T) where each program takes BLOCK_N gate rows and
the same BLOCK_N up rows (HALF further), multiplies both by the tokens' tile, and stores
silu(gate) * up [M, HALF] instead of [gate | up] [M, 2 HALF].

Each product is summed along K as `_dense_tma_kernel` sums it at the same BLOCK_K and tokens
a tile (one part of K), rounded to the activations' dtype as its epilogue stores it, then
formed and rounded as silu_mul.silu_and_mul forms it: the bits of that GEMM's config followed
by SiLU-and-mul. Under PDL nothing is read before the grid wait (the dense kernel's
prefetch was slower at the 8B's shapes)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl
from parashift.kernels.fp8_gemm_tma import MAX_BLOCK_K, _weight_descriptor, fits
from parashift.kernels.gated_tma import gate_and_up
from parashift.kernels.silu_values import silu_mul_values


@triton.jit
def _dense_gated_kernel(x_desc, w_desc, y_ptr, M, HALF, K, stride_ym, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        NUM_STAGES: tl.constexpr, LIBDEVICE: tl.constexpr,
                        USE_PDL: tl.constexpr):
    """One program a (token tile, gate column tile): the token tiles of one column tile
    launched next to each other, as the dense kernel's."""
    first_m = tl.program_id(0) * BLOCK_M
    first_n = tl.program_id(1) * BLOCK_N
    pdl.start(USE_PDL)
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    gate, up = gate_and_up(x_desc, w_desc, first_m, first_n, HALF, K, BLOCK_M, BLOCK_N,
                           BLOCK_K, NUM_STAGES)
    out_ty = y_ptr.dtype.element_ty
    product = silu_mul_values(tl.trans(gate).to(out_ty), tl.trans(up).to(out_ty), LIBDEVICE)
    pdl.inputs_read(USE_PDL)
    y = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y, product.to(out_ty), mask=(offs_m < M)[:, None] & (offs_n < HALF)[None, :])


def gated_linear(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_m: int,
                 block_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """silu_and_mul(x weight^T) [M, HALF] in x's dtype: x [M, K] 16-bit, weight [2 HALF, K]
    ([gate; up]) of x's dtype with unit stride along K and 16-byte aligned rows; block_n gate
    rows (and as many up rows) and block_m tokens a program."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if weight.shape[0] % 2 or block_k > MAX_BLOCK_K or not fits(weight) \
            or x.dtype != weight.dtype:
        raise ValueError(f"gated_linear takes a [gate; up] weight of even rows in x's dtype "
                         f"with 16-byte aligned rows and BLOCK_K <= {MAX_BLOCK_K}, got x "
                         f"{x.dtype}, weight {tuple(weight.shape)} {weight.dtype} strides "
                         f"{weight.stride()}, BLOCK_K {block_k}")
    x = x if fits(x) else x.clone(memory_format=torch.contiguous_format)
    (m, k), half = x.shape, weight.shape[0] // 2
    y = torch.empty(m, half, dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [block_m, block_k])
    _dense_gated_kernel[(triton.cdiv(m, block_m), triton.cdiv(half, block_n))](
        x_desc, _weight_descriptor(weight, block_n, block_k), y, m, half, k, y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=num_stages,
        LIBDEVICE=x.is_cuda, num_warps=num_warps, enable_fp_fusion=False,
        **pdl.launch_options(x.device))
    return y
