"""RoPE (neox 'rotate half') and a model's q/k RMS norms on heads held as their two halves
[heads, HALF] in fp32, as every kernel that rotates computes them (kernels/rotary.py's, the
one-launch decode attention's with ROPE), rounded as parashift.layers.rotary.apply_rotary_torch
and layers.layernorm.rms_norm_torch round.

MUL_RN: each product rounded on its own (PTX's mul.rn.f32, which is never contracted), for a
kernel compiled with FP fusion on (the attention's arithmetic takes FMAs), where a product
followed by an add would otherwise become one FMA and other bits than kernels/rotary.py's
(compiled without fusion); libdevice's mul_rn would flush subnormals (Triton links it with
FTZ); the interpreter has no inline PTX and fuses nothing."""
import triton
import triton.language as tl


@triton.jit
def _product(a, b, MUL_RN: tl.constexpr):
    if MUL_RN:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return a * b


@triton.jit
def rms_norm_halves(x1, x2, w_ptr, eps, dims, dtype: tl.constexpr, HALF: tl.constexpr,
                    MUL_RN: tl.constexpr = False):
    """Each head's RMS norm (Qwen3's q/k norms) of its halves [heads, HALF] in fp32, rounded as
    rms_norm_torch rounds: the normalized values, then their weighted ones, to `dtype`."""
    squares = tl.sum(_product(x1, x1, MUL_RN), 1) + tl.sum(_product(x2, x2, MUL_RN), 1)
    rstd = tl.math.rsqrt(_product(squares, 1.0 / (2 * HALF), MUL_RN) + eps)
    w1 = tl.load(w_ptr + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    n1 = (x1 * rstd[:, None]).to(dtype).to(tl.float32)
    n2 = (x2 * rstd[:, None]).to(dtype).to(tl.float32)
    return (w1 * n1).to(dtype).to(tl.float32), (w2 * n2).to(dtype).to(tl.float32)


@triton.jit
def rotated_halves(x1, x2, cos, sin, MUL_RN: tl.constexpr = False):
    """(x1 cos - x2 sin, x2 cos + x1 sin) in fp32: the rotated halves, before rounding."""
    return (_product(x1, cos, MUL_RN) - _product(x2, sin, MUL_RN),
            _product(x2, cos, MUL_RN) + _product(x1, sin, MUL_RN))


@triton.jit
def rotated_heads(x_rows, ok, cos, sin, norm_w_ptr, eps, HALF: tl.constexpr,
                  HALF_P: tl.constexpr, QK_NORM: tl.constexpr, MUL_RN: tl.constexpr = False):
    """The heads at x_rows (pointers [R], those where `ok`) loaded as halves, RMS-normed
    (QK_NORM) and rotated: their two halves [R, HALF_P] in fp32, before rounding (cos, sin
    [1, HALF_P])."""
    dims = tl.arange(0, HALF_P)[None, :]
    mask = ok[:, None] & (dims < HALF)
    src = x_rows[:, None] + dims
    x1 = tl.load(src, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        x1, x2 = rms_norm_halves(x1, x2, norm_w_ptr, eps, dims, dtype, HALF, MUL_RN)
    return rotated_halves(x1, x2, cos, sin, MUL_RN)
