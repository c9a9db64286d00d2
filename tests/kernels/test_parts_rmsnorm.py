"""The parts-out split-K GEMMs (fp8_gemm_tma.tma_parts, dense_gemm_tma.tma_parts) and the
residual-add RMSNorm summing their parts (kernels/parts_rmsnorm.py): bit for bit the ticket
path of the same config followed by the plain norm (add_rms_norm; rms_norm_fp8's four outputs
after an FP8 GEMM): one small case under the Triton interpreter, the registered candidates
at the 8B's o_proj and down shapes on CUDA."""
import pytest
import torch
import triton

from parashift.kernels import dense_gemm_tma, fp8_gemm, fp8_gemm_tma, parts_rmsnorm, \
    rmsnorm, split_parts_choice
from parashift.kernels.dense_gemm_tma import Config as DenseConfig
from parashift.kernels.parts_rmsnorm import parts_add_rms_norm
from tests.kernels.common import case_tests, cuda, randn, reduction_layouts, sm90_ttgir
from tests.kernels.test_fp8_gemm import operands

EPS = 1e-5
# K split in 3 (a part past K's end at k 80: steps of 32), partial row and column tiles;
# the FP8 kernel with row tiles of 16 tokens (the interpreter's w8a8 limit)
SMALL_DENSE = (DenseConfig(64, 16, 32, 4, 2, 3),)
SMALL_FP8 = (fp8_gemm.Config("tma_w8a8", 64, 32, 4, 2, 3, max_block_m=16),)
CASES = [dict(m=20, n=80, k=80)]


def check(m, n, k, dtype="float32", device="cpu", dense_configs=SMALL_DENSE,
          fp8_configs=SMALL_FP8):
    x, w8, scale, _, _ = operands(m, n, k, False, dtype, device)
    residual = randn((m, n), dtype, device, seed=4)
    norm_weight = randn((n,), dtype, device, seed=5, scale=0.5) + 1
    dense_w = randn((n, k), dtype, device, seed=2, scale=k ** -0.5)
    for config in dense_configs:
        ticket = dense_gemm_tma.tma_linear(x, dense_w, None, config)
        expected = rmsnorm.add_rms_norm(ticket, residual, norm_weight, EPS)
        parts = dense_gemm_tma.tma_parts(x, dense_w, config)
        assert parts.shape == (config.split_k, m, n)
        actual = parts_add_rms_norm(parts, None, None, residual, norm_weight, EPS)
        assert_same(actual, expected, config)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    for config in fp8_configs:
        ticket = fp8_gemm.fp8_weight_linear(x, w8, scale, None,
                                            fp8_gemm.Config(**{**config.__dict__,
                                                               "tickets": True}),
                                            (xq, x_scale))
        expected = rmsnorm.rms_norm_fp8(ticket, residual, norm_weight, EPS)
        parts, w_scale, t_scale = split_parts_choice.parts_of(x, w8, scale, config,
                                                             (xq, x_scale))
        actual = parts_add_rms_norm(parts, w_scale, t_scale, residual, norm_weight, EPS,
                                    quant=True)
        assert_same(actual, expected, config)
        # the plain norm's outputs of the ticket path without the E4M3 ones
        assert_same(parts_add_rms_norm(parts, w_scale, t_scale, residual, norm_weight, EPS),
                    rmsnorm.add_rms_norm(ticket, residual, norm_weight, EPS), config)


def assert_same(actual, expected, config):
    assert len(actual) == len(expected), config
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape, config
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), config


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("m, k", [(40, 4096), (64, 4096), (64, 14336)])
def test_candidates_at_8b_shapes_equal_the_ticket_path(m, k):
    """The registered candidates at the 8B's o_proj [4096, 4096] and down [4096, 14336],
    bf16 activations."""
    check(m, 4096, k, "bfloat16", "cuda", split_parts_choice.DENSE_CONFIGS,
          split_parts_choice.FP8_CONFIGS)


@cuda
def test_odd_shape_with_partial_tiles_equals_the_ticket_path():
    check(37, 200, 320, "bfloat16", "cuda", split_parts_choice.DENSE_CONFIGS,
          split_parts_choice.FP8_CONFIGS)


def test_parts_and_residual_shapes_are_checked():
    with pytest.raises(ValueError, match="parts_add_rms_norm"):
        parts_add_rms_norm(torch.zeros(2, 3, 8), None, None, torch.zeros(3, 4),
                           torch.ones(8), EPS)


@pytest.mark.parametrize("n, parts, quant", [(4096, 2, False), (4096, 4, True), (200, 3, True)])
def test_sums_the_squares_in_the_plain_kernels_order(n, parts, quant):
    """The interpreter adds in one order whatever the kernel: on CUDA the order is the
    compiled layout's, which the fp32 parts' and scales' loads must not change (the plain
    kernel's after a bf16 GEMM: rmsnorm.py's VEC, from the same tensors' dtypes)."""
    bf16 = torch.empty(1, n, dtype=torch.bfloat16)
    block, vec = triton.next_power_of_2(n), rmsnorm.vector_width(bf16, bf16, bf16, bf16)
    common = dict(out_ptr=torch.bfloat16, new_x_ptr=torch.bfloat16,
                  q_ptr=torch.float8_e4m3fn, s_ptr=torch.float32)
    plain_args = dict(common, x_ptr=torch.bfloat16, residual_ptr=torch.bfloat16,
                      weight_ptr=torch.bfloat16, eps="fp32", stride_xr="i32",
                      stride_xh="i32", stride_rr="i32", stride_rh="i32")
    parts_args = dict(common, part_ptr=torch.float32, ws_ptr=torch.float32,
                      xs_ptr=torch.float32, residual_ptr=torch.bfloat16,
                      weight_ptr=torch.bfloat16, eps="fp32", rows="i32", stride_rr="i32")
    shared = dict(N=n, BLOCK=block, QUANT=quant, FP8_MAX=fp8_gemm.FP8_MAX, VEC=vec,
                  USE_PDL=False)
    plain = sm90_ttgir(rmsnorm._rms_norm_kernel, plain_args,
                       dict(shared, HAS_RESIDUAL=True, EARLY_LOADS=True),
                       rmsnorm.num_warps(block))
    summing = sm90_ttgir(parts_rmsnorm._parts_rms_norm_kernel, parts_args,
                         dict(shared, PARTS=parts, W_SCALED=True, X_SCALED=True),
                         rmsnorm.num_warps(block))
    assert len(reduction_layouts(summing)) == 1 + quant  # the squares (and the largest)
    assert reduction_layouts(summing) == reduction_layouts(plain)


def sm90_wgmma(kernel, signature: dict, constexprs: dict) -> list[str]:
    """The kernel's wgmma instructions (operands dropped) compiled for sm_90 on the CPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    source = ASTSource(fn=kernel, signature={**signature, **dict.fromkeys(constexprs,
                                                                         "constexpr")},
                       constexprs=constexprs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4}).asm["ptx"]
    return [line.split()[0] for line in ptx.splitlines() if "wgmma" in line]


def test_parts_out_keeps_the_ticket_kernels_wgmma_chain():
    """The parts-out variants compile for sm_90 with the ticket variants' wgmma chain (the
    same products summed in the same order: the parts the ticket path stores)."""
    scalars = dict(M="i32", N="i32", K="i32", stride_ym="i32")
    fp8 = dict(x_desc="tensordesc<fp8e4nv[64, 256]>", xs_ptr="*fp32",
               w_desc="tensordesc<fp8e4nv[64, 256]>", w_ptr="*fp8e4nv", stride_wn="i32",
               s_ptr="*fp32", b_ptr="*fp32", y_ptr="*bf16", part_ptr="*fp32",
               counter_ptr="*i32", **scalars)
    dense = dict(x_desc="tensordesc<bf16[64, 128]>", w_desc="tensordesc<bf16[64, 128]>",
                 b_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32", counter_ptr="*i32", **scalars)
    fp8_shape = dict(HAS_BIAS=False, FP8_X=True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=256,
                     SPLIT_K=2, NUM_STAGES=5, BIT_WIDEN=False, USE_PDL=1, PREFETCH_K=0,
                     EARLY_SCALES=True)
    dense_shape = dict(HAS_BIAS=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2,
                       NUM_STAGES=6, USE_PDL=1)
    for kernel, signature, shape in ((fp8_gemm_tma._fp8_tma_kernel, fp8, fp8_shape),
                                     (dense_gemm_tma._dense_tma_kernel, dense, dense_shape)):
        tickets = sm90_wgmma(kernel, signature, dict(shape, TICKETS=True, PARTS_OUT=False))
        parts = sm90_wgmma(kernel, signature, dict(shape, TICKETS=False, PARTS_OUT=True))
        assert any("mma_async" in op for op in tickets) and parts == tickets
