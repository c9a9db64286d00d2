"""RMSNorm over the last dim, optionally fused with the residual add; one
program per row. Rounds like parashift.layers.layernorm.rms_norm_torch: the
add in the input dtype, the normalisation in fp32 rounded to that dtype, then
the product with the weight rounded again. `rms_norm_fp8` also writes each
row in E4M3 with its scale, as `fp8_gemm.quantize_rows` makes them of the
output (the next FP8 linear layer's activations, without a kernel of their own).

Every load and store of a row moves VEC elements a thread (16 bytes of the widest dtype):
Triton lays a row out by its memory ops, and the E4M3 store alone would take 16 a thread,
so the FP8 variant would sum the squares in another order than the plain kernel (fp32
results 1 ulp apart, issue 60) without the cap.

Many short rows (Qwen3's per-head q/k norms at a prefill: 4,096 tokens x 32 heads of 128)
take `_rms_norm_heads_kernel`: ITEMS rows a program, each normalised by the plain kernel's
code in the plain kernel's layout (one warp a 128-wide row), so the same bits; one program
a row of 128 left most of each SM's time to launching programs (53 us a norm on an H200)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl
from parashift.kernels.fp8_gemm import FP8, FP8_MAX, row_scale, to_fp8


@triton.jit
def _rms_norm_kernel(out_ptr, new_x_ptr, q_ptr, s_ptr, x_ptr, residual_ptr, weight_ptr, eps,
                     stride_xr, stride_xh, stride_rr, stride_rh,
                     N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     QUANT: tl.constexpr, FP8_MAX: tl.constexpr, VEC: tl.constexpr,
                     USE_PDL: tl.constexpr, EARLY_LOADS: tl.constexpr = True):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.max_contiguous(tl.arange(0, BLOCK), VEC)
    mask = cols < N
    if EARLY_LOADS:  # the weight is no kernel's output: its load (from HBM: a step's GEMV
        # weights have evicted it) runs during the kernel before, not after the row's
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl.start(USE_PDL)
    out_offs = (row * tl.num_programs(1) + head) * N + cols
    x = tl.load(x_ptr + row * stride_xr + head * stride_xh + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_rr + head * stride_rh + cols, mask=mask, other=0.0)
        x = add_residual(x, r, new_x_ptr, out_offs, mask)
    if not EARLY_LOADS:
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normalize_row(x, w, out_ptr, out_offs, q_ptr, s_ptr, row, mask, eps, N, QUANT, FP8_MAX,
                  USE_PDL)


@triton.jit
def add_residual(x, r, new_x_ptr, out_offs, mask):
    """x + r rounded to new_x's dtype, stored there (the next residual) and returned."""
    x = (x.to(tl.float32) + r.to(tl.float32)).to(new_x_ptr.dtype.element_ty)
    tl.store(new_x_ptr + out_offs, x, mask=mask)
    return x


@triton.jit
def normalize_row(x, w, out_ptr, out_offs, q_ptr, s_ptr, row, mask, eps, N: tl.constexpr,
                  QUANT: tl.constexpr, FP8_MAX: tl.constexpr, USE_PDL: tl.constexpr):
    """The row x normalized, times the weight w (fp32), stored in out's dtype (and, QUANT,
    in E4M3 with its scale)."""
    xf = x.to(tl.float32)
    # torch's CUDA mean multiplies the sum by fl(1 / N)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) * (1.0 / N) + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    out = (w * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + out_offs, out, mask=mask)
    if QUANT:  # one head a row: the row's scale and E4M3 values, as _quantize_rows_kernel's
        y = out.to(tl.float32)
        scale = row_scale(tl.max(tl.abs(y), axis=0), FP8_MAX)
        to_fp8(y, scale, q_ptr + out_offs, mask, FP8_MAX)
        tl.store(s_ptr + row, scale)


@triton.jit
def _rms_norm_heads_kernel(out_ptr, x_ptr, weight_ptr, weight2_ptr, eps, items, heads,
                           first_head2, stride_xr, stride_xh,
                           N: tl.constexpr, BLOCK: tl.constexpr, ITEMS: tl.constexpr,
                           VEC: tl.constexpr, USE_PDL: tl.constexpr):
    """Rows first.. first + ITEMS of x [rows, heads, N] read as rows * heads rows (out
    contiguous), each as _rms_norm_kernel normalises one; heads from first_head2 on by
    weight2 (Qwen3's k heads after its q heads)."""
    cols = tl.max_contiguous(tl.arange(0, BLOCK), VEC)
    mask = cols < N
    first = tl.program_id(0).to(tl.int64) * ITEMS
    w1 = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # before the wait
    w2 = tl.load(weight2_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl.start(USE_PDL)
    for i in tl.static_range(ITEMS):
        item = first + i
        live = cols < tl.where(item < items, N, 0)  # a row past the end: nothing
        head = item % heads
        x = tl.load(x_ptr + (item // heads) * stride_xr + head * stride_xh + cols, mask=live,
                    other=0.0)
        xf = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) * (1.0 / N) + eps)
        normed = (xf * rstd).to(x.dtype).to(tl.float32)
        w = tl.where(head < first_head2, w1, w2)
        tl.store(out_ptr + item * N + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=live)
    pdl.inputs_read(USE_PDL)


HEADS_ITEMS = 16  # rows a program of _rms_norm_heads_kernel
MANY_HEAD_ROWS = 8192  # from this many rows of several heads (a decode's stay one a program)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim; x of any rank and strides."""
    if x.dim() >= 3 and x.shape[-2] > 1 and x.numel() // x.shape[-1] >= MANY_HEAD_ROWS:
        return rms_norm_heads(x, weight, eps)
    return _launch(x, None, weight, eps)[0]


def rms_norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   items: int = HEADS_ITEMS, weight2: torch.Tensor | None = None,
                   first_head2: int | None = None) -> torch.Tensor:
    """rms_norm of x [.., heads, n], `items` rows of n a program: the same bits; heads
    first_head2.. normalised by weight2 instead (two norms in one launch)."""
    if (weight2 is None) != (first_head2 is None) or \
            (weight2 is not None and weight2.dtype != weight.dtype):
        raise ValueError("rms_norm_heads: weight2 and first_head2 come together, weight2 in "
                         "weight's dtype")
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    xs = _as_3d(x)
    rows, heads, n = xs.shape
    block = triton.next_power_of_2(n)
    weight = weight.contiguous()
    _rms_norm_heads_kernel[(triton.cdiv(rows * heads, items),)](
        out, xs, weight, weight if weight2 is None else weight2.contiguous(), eps, rows * heads,
        heads, heads if first_head2 is None else first_head2, xs.stride(0), xs.stride(1),
        N=n, BLOCK=block, ITEMS=items, VEC=vector_width(x, weight, out),
        num_warps=num_warps(block), enable_fp_fusion=False, **pdl.launch_options(x.device))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass."""
    return _launch(x, residual, weight, eps)[:2]


def rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, x + residual (x without one), E4M3 [rows, n], fp32 scale [rows, 1]) in one
    pass: out as `rms_norm`/`add_rms_norm` give it, its rows (x's last dim) quantized as
    `fp8_gemm.quantize_rows(out)` quantizes them."""
    return _launch(x, residual, weight, eps, quant=True)


def _launch(x, residual, weight, eps, quant=False):
    dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    new_x = x if residual is None else torch.empty(x.shape, dtype=dtype, device=x.device)
    out = torch.empty(x.shape, dtype=torch.promote_types(dtype, weight.dtype), device=x.device)
    xs = _as_3d(x)
    rs = xs if residual is None else _as_3d(residual)
    rows, heads, n = xs.shape
    if quant and heads != 1:
        raise ValueError(f"rms_norm_fp8 quantizes whole rows: x {tuple(x.shape)} has "
                         "several heads a row")
    q, scale = out, out  # unused without quant (and no E4M3 in the kernel's signature)
    if quant:
        q = torch.empty(rows, n, dtype=FP8, device=x.device)
        scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows, heads)](
        out, new_x, q, scale, xs, rs, weight.contiguous(), eps,
        xs.stride(0), xs.stride(1), rs.stride(0), rs.stride(1),
        N=n, BLOCK=block, HAS_RESIDUAL=residual is not None, QUANT=quant, FP8_MAX=FP8_MAX,
        VEC=vector_width(x, residual, weight, out), num_warps=num_warps(block),
        enable_fp_fusion=False, EARLY_LOADS=pdl.early_loads(), **pdl.launch_options(x.device))
    return out, new_x, q, scale


def num_warps(block: int) -> int:
    return min(max(block // 256, 1), 8)


def vector_width(*tensors: torch.Tensor | None) -> int:
    """Elements a thread moves per load or store: 16 bytes of the widest of the dtypes."""
    return 16 // max(t.element_size() for t in tensors if t is not None)


def _as_3d(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, heads, n] with unit stride on n; a view where strides allow."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() < 3:
        return x.reshape(-1, 1, x.shape[-1])
    return x.reshape(-1, *x.shape[-2:])
