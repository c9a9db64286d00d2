"""FP8 E4M3 weights with one scale per output channel (row), and the GEMM that reads them.

`fp8_linear` is the one place the FP8 GEMM is chosen: on CUDA (default mode) activations
are quantized per token at run time and `kernels/fp8_gemm.py` multiplies (a Triton kernel
up to 64 rows where it measured faster, else `torch._scaled_mm` with rowwise scales);
elsewhere (the CPU, deterministic mode) the weight is dequantized to the activations'
dtype and the layer's own GEMM runs, so the stored bytes stay FP8 and every plan and
batch computes the same function."""
import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_TINY = 1e-12  # an all-zero row's scale: any positive number keeps it zero


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype == FP8


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 weight, fp32 scale [..., rows, 1]): each row (last dim) scaled so its
    largest magnitude is E4M3's largest finite value; weight ≈ q * scale."""
    w = weight.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=_TINY) / FP8_MAX
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (weight.float() * scale).to(dtype)


def to_fp8_range(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale, saturated to E4M3's range (a cast past it is NaN), still in x's dtype."""
    return (x if scale == 1.0 else x / scale).clamp(-FP8_MAX, FP8_MAX)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation scales: one per token (row)."""
    return quantize_rows(x)


def _scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      bias: torch.Tensor | None, input_scale: torch.Tensor | None
                      ) -> torch.Tensor:
    """cuBLASLt's FP8 GEMM, rowwise scales: x per token (or the checkpoint's static
    scale, repeated per row), the weight per output channel."""
    rows = x.reshape(-1, x.shape[-1])
    if input_scale is None:
        xq, x_scale = quantize_per_token(rows)
    else:
        x_scale = input_scale.reshape(1, 1).expand(rows.shape[0], 1).contiguous()
        xq = (rows.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale.reshape(1, -1),
                         bias=bias, out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], -1)


def _runs_fp8_gemm(device: torch.device, weight: torch.Tensor, matmul, dense_matmul) -> bool:
    return (device.type == "cuda" and matmul is dense_matmul and weight.shape[0] % 16 == 0
            and weight.shape[1] % 16 == 0)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None, matmul, dense_matmul,
               input_scale: torch.Tensor | None = None,
               x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """y = x (weight * scale)^T + bias. `matmul`: the layer's GEMM for dequantized weights;
    `dense_matmul`: the default mode's (only then may the FP8 GEMM replace it);
    `input_scale`: a static activation scale (None: per token, at run time); `x_fp8`: x's
    rows quantized per token already (by the op before: layers/fp8_input.py), or None."""
    if _runs_fp8_gemm(x.device, weight, matmul, dense_matmul):
        if input_scale is None:
            from parashift.kernels import fp8_gemm
            return fp8_gemm.linear(x, weight, scale, bias, x_fp8)
        return _scaled_mm_linear(x, weight, scale, bias, input_scale)
    return matmul(x, dequantize(weight, scale, x.dtype), bias)


def quantizes_per_token(rows: int, dtype: torch.dtype, device: torch.device,
                        weight: torch.Tensor, bias: torch.Tensor | None, matmul,
                        dense_matmul) -> bool:
    """Whether `fp8_linear` (dynamic activation scales) of `rows` rows of `dtype` would
    quantize them per token, so that the op making them may hand them over quantized."""
    if rows == 0 or not _runs_fp8_gemm(device, weight, matmul, dense_matmul):
        return False
    from parashift.kernels import fp8_gemm
    return fp8_gemm.quantizes_activations(rows, weight, dtype, device, bias is not None)
