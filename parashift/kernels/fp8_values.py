"""A row's E4M3 values and scale as `fp8_gemm.quantize_rows` makes them: the kernels that write
FP8 rows beside their output (the RMSNorm, SiLU-and-mul, gate_up's TMA epilogue) call these
as its kernel does, so their rows are its bit for bit."""
import triton
import triton.language as tl


@triton.jit
def row_scale(largest, FP8_MAX: tl.constexpr):
    """A row's scale from its largest magnitude (fp32); the fused kernels call this and
    `to_fp8` as _quantize_rows_kernel does, so their rows are its bit for bit."""
    return tl.maximum(largest, 1e-12) / FP8_MAX


@triton.jit
def to_fp8(x, scale, q_ptrs, mask, FP8_MAX: tl.constexpr):
    """Stores x (fp32) / scale in E4M3 at q_ptrs."""
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)
