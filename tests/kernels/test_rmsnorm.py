"""The RMSNorm kernels against the torch path they replace: under the Triton
interpreter on the CPU (float32, float16; it has no bfloat16) and compiled on
CUDA (bfloat16 too). The FP8 variant against the kernels it stands for (the plain
norm, then `fp8_gemm.quantize_rows`), bit for bit."""
import pytest
import torch
import triton

from parashift.kernels import fp8_gemm, rmsnorm
from parashift.layers.layernorm import RMSNorm, add_rms_norm_torch, rms_norm_torch
from tests.kernels.common import (as_bytes, assert_exact, assert_fp8_rows, assert_graph_replays,
                                  assert_last_bits, case_tests, cuda, randn, reduction_layouts,
                                  sm90_ttgir)

EPS = 1e-6
# heads: x is [rows, heads, n], as Qwen3's q_norm/k_norm see it; strided: x is
# a view into a wider buffer, as q and k split from the qkv projection are
CASES = [
    dict(rows=1, n=100),
    dict(rows=7, n=576, residual=True),
    dict(rows=33, n=4096, residual=True),
    dict(rows=1, n=4096, residual=True, strided=True),
    dict(rows=5, heads=4, n=128, strided=True),
    dict(rows=3, heads=2, n=100, residual=True),
]


def check(rows, n, heads=None, residual=False, strided=False, dtype="float32", device="cpu"):
    shape = (rows, n) if heads is None else (rows, heads, n)
    x = randn(shape, dtype, device, strided=strided)
    weight = 1 + 0.1 * randn((n,), dtype, device, seed=1)
    # the kernels sum the squares in another order than torch: the last bits
    # of fp32 results differ, rare 16-bit ones round the other way
    if not residual:
        assert_last_bits(rmsnorm.rms_norm(x, weight, EPS), rms_norm_torch(x, weight, EPS))
        return
    r = randn(shape, dtype, device, seed=2)
    out, new_x = rmsnorm.add_rms_norm(x, r, weight, EPS)
    ref_out, ref_new_x = add_rms_norm_torch(x, r, weight, EPS)
    assert_exact(new_x, ref_new_x)  # one fp32 add rounded to the dtype, as torch does
    assert_last_bits(out, ref_out)


test_interpreted, test_cuda = case_tests(__name__, check, CASES)

# odd row counts and widths; zero_row: an all-zero row (its scale the smallest)
FP8_CASES = [
    dict(rows=1, n=100),
    dict(rows=7, n=576, residual=True),
    dict(rows=33, n=4096, residual=True),
    dict(rows=3, n=1000, residual=True, strided=True),
    dict(rows=5, n=96, zero_row=True),
]


def check_fp8(rows, n, residual=False, strided=False, zero_row=False, dtype="float32",
              device="cpu"):
    x = randn((rows, n), dtype, device, strided=strided)
    if zero_row:
        x[rows // 2] = 0
    weight = 1 + 0.1 * randn((n,), dtype, device, seed=1)
    r = randn((rows, n), dtype, device, seed=2) if residual else None
    out, new_x, q, scale = rmsnorm.rms_norm_fp8(x, r, weight, EPS)
    if residual:
        plain_out, plain_new_x = rmsnorm.add_rms_norm(x, r, weight, EPS)
        assert_exact(new_x, plain_new_x)
    else:
        plain_out = rmsnorm.rms_norm(x, weight, EPS)
        assert new_x is x
    assert_exact(out, plain_out)
    assert_fp8_rows(q, scale, fp8_gemm.quantize_rows(out), out)


test_fp8_interpreted, test_fp8_cuda = case_tests(__name__, check_fp8, FP8_CASES)


@pytest.mark.parametrize("dtype, n, residual", [
    (torch.float32, 576, True), (torch.bfloat16, 4096, True), (torch.float16, 100, False)])
def test_fp8_variant_sums_the_squares_in_the_plain_kernels_order(dtype, n, residual):
    """The interpreter adds in one order whatever the kernel: on CUDA the order is the
    compiled layout's, which the E4M3 store must not change (an fp32 sum's last bit did,
    on an H200)."""
    x = torch.empty(1, n, dtype=dtype)
    block = triton.next_power_of_2(n)
    args = dict(out_ptr=dtype, new_x_ptr=dtype, q_ptr=torch.float8_e4m3fn,
                s_ptr=torch.float32, x_ptr=dtype, residual_ptr=dtype, weight_ptr=dtype,
                eps="fp32", stride_xr="i32", stride_xh="i32", stride_rr="i32",
                stride_rh="i32")
    layouts = {}
    for quant in (False, True):
        constexprs = dict(N=n, BLOCK=block, HAS_RESIDUAL=residual, QUANT=quant,
                          FP8_MAX=fp8_gemm.FP8_MAX, VEC=rmsnorm.vector_width(x, x, x, x),
                          USE_PDL=False, EARLY_LOADS=True)
        ir = sm90_ttgir(rmsnorm._rms_norm_kernel, args, constexprs, rmsnorm.num_warps(block))
        layouts[quant] = reduction_layouts(ir)
    assert len(layouts[True]) == 2  # the sum of squares, then the largest magnitude
    assert layouts[True][0] == layouts[False][0]


# many short rows a program (a prefill's per-head q/k norms): the plain kernel's bits; odd
# row counts (a last program part empty), strided q/k views, items not dividing the rows
HEADS_CASES = [
    dict(rows=5, heads=4, n=128, strided=True, items=16),
    dict(rows=37, heads=3, n=100, items=8),
    dict(rows=9, heads=8, n=64, strided=True, items=5),
    dict(rows=1, heads=2, n=128, items=16),
]


def check_heads(rows, heads, n, items, strided=False, dtype="float32", device="cpu"):
    x = randn((rows, heads, n), dtype, device, strided=strided)
    weight = 1 + 0.1 * randn((n,), dtype, device, seed=1)
    out = rmsnorm.rms_norm_heads(x, weight, EPS, items)
    assert out.shape == x.shape and out.is_contiguous()
    assert_exact(out, rmsnorm._launch(x, None, weight, EPS)[0])
    assert_last_bits(out, rms_norm_torch(x, weight, EPS))
    # the heads from `split` on by a second weight (Qwen3's q and k norms in one launch)
    split = (heads + 1) // 2
    weight2 = 1 + 0.1 * randn((n,), dtype, device, seed=3)
    both = rmsnorm.rms_norm_heads(x, weight, EPS, items, weight2, split)
    assert_exact(both[:, :split], rmsnorm._launch(x[:, :split], None, weight, EPS)[0])
    assert_exact(both[:, split:], rmsnorm._launch(x[:, split:], None, weight2, EPS)[0])


test_heads_interpreted, test_heads_cuda = case_tests(__name__, check_heads, HEADS_CASES)


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 128), (torch.float32, 128),
                                      (torch.float16, 100)])
def test_heads_kernel_sums_the_squares_in_the_plain_kernels_order(dtype, n):
    """Compiled for sm_90: the per-head kernel's row sums take the plain kernel's layout
    (the interpreter adds in one order whatever the layout)."""
    x = torch.empty(1, n, dtype=dtype)
    block = triton.next_power_of_2(n)
    vec = rmsnorm.vector_width(x, x, x)
    plain = dict(out_ptr=dtype, new_x_ptr=dtype, q_ptr=torch.float8_e4m3fn,
                 s_ptr=torch.float32, x_ptr=dtype, residual_ptr=dtype, weight_ptr=dtype,
                 eps="fp32", stride_xr="i32", stride_xh="i32", stride_rr="i32",
                 stride_rh="i32")
    ir = sm90_ttgir(rmsnorm._rms_norm_kernel, plain,
                    dict(N=n, BLOCK=block, HAS_RESIDUAL=False, QUANT=False,
                         FP8_MAX=fp8_gemm.FP8_MAX, VEC=vec, USE_PDL=False, EARLY_LOADS=True),
                    rmsnorm.num_warps(block))
    heads = dict(out_ptr=dtype, x_ptr=dtype, weight_ptr=dtype, weight2_ptr=dtype, eps="fp32",
                 items="i32", heads="i32", first_head2="i32", stride_xr="i32", stride_xh="i32")
    heads_ir = sm90_ttgir(rmsnorm._rms_norm_heads_kernel, heads,
                          dict(N=n, BLOCK=block, ITEMS=4, VEC=vec, USE_PDL=False),
                          rmsnorm.num_warps(block))
    layouts = reduction_layouts(heads_ir)
    assert len(layouts) == 4 and set(layouts) == {reduction_layouts(ir)[0]}


def test_many_head_rows_take_the_heads_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(rmsnorm, "rms_norm_heads", lambda *a: calls.append(a[0].shape))
    monkeypatch.setattr(rmsnorm, "_launch", lambda *a: calls.append("plain") or (None,))
    rmsnorm.rms_norm(torch.zeros(256, 32, 128), torch.ones(128), EPS)  # 8,192 head rows
    rmsnorm.rms_norm(torch.zeros(255, 32, 128), torch.ones(128), EPS)  # a decode's
    rmsnorm.rms_norm(torch.zeros(8192, 1, 128), torch.ones(128), EPS)  # one head
    assert calls == [(256, 32, 128), "plain", "plain"]


def test_fp8_refuses_rows_of_several_heads():
    with pytest.raises(ValueError, match="several heads"):
        rmsnorm.rms_norm_fp8(torch.zeros(2, 3, 16), None, torch.ones(16), EPS)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_layer_runs_kernels_on_cuda_only(monkeypatch, device):
    calls = []
    monkeypatch.setattr(rmsnorm, "rms_norm", lambda *a: calls.append("norm") or rms_norm_torch(*a))
    monkeypatch.setattr(rmsnorm, "add_rms_norm",
                        lambda *a: calls.append("add") or add_rms_norm_torch(*a))
    layer, x = RMSNorm(64).to(device), randn((3, 64), "float32", device)
    layer(x)
    layer(x, x)
    assert calls == (["norm", "add"] if device == "cuda" else [])


@cuda
def test_cuda_graph_capture():
    x, r = randn((4, 4096), "bfloat16", "cuda"), randn((4, 4096), "bfloat16", "cuda", seed=1)
    weight = randn((4096,), "bfloat16", "cuda", seed=2)
    assert_graph_replays(lambda: rmsnorm.add_rms_norm(x, r, weight, EPS), [x, r])
    assert_graph_replays(lambda: as_bytes(rmsnorm.rms_norm_fp8(x, r, weight, EPS)), [x, r])
