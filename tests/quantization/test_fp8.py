"""FP8 rows and their scales: round trip, slicing together, the CPU's GEMM."""
import torch
import torch.nn.functional as F

from parashift.layers.linear import WeightPart, linear
from parashift.quantization.fp8 import (FP8, FP8_MAX, dequantize, fp8_linear, quantize_rows,
                                        to_fp8_range)


def test_rows_round_trip_within_e4m3_precision():
    w = torch.randn(32, 64) * torch.logspace(-3, 2, 32)[:, None]  # rows of many magnitudes
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.shape == (32, 1)
    assert torch.equal(q.float().abs().amax(1), torch.full((32,), FP8_MAX))
    error = (dequantize(q, scale, torch.float32) - w).abs() / w.abs().amax(1, keepdim=True)
    assert error.max() < 2 ** -4  # 3 mantissa bits: half an ulp at the top binade


def test_parts_slice_rows_with_their_scales_and_columns_without():
    q, scale = quantize_rows(torch.randn(8, 16))
    part = WeightPart(q, torch.arange(8.0), scale)
    rows = part.rows(2, 3)
    assert torch.equal(rows.scale, scale[2:5]) and torch.equal(rows.bias, torch.arange(2.0, 5))
    cols = part.columns(4, 4)
    assert cols.weight.shape == (8, 4) and cols.scale is scale
    joined = WeightPart.cat([part.rows(4, 4), part.rows(0, 4)])
    assert torch.equal(joined.scale, torch.cat([scale[4:], scale[:4]]))


def test_cpu_gemm_dequantizes():
    w, x = torch.randn(24, 32), torch.randn(5, 32)
    q, scale = quantize_rows(w)
    got = fp8_linear(x, q, scale, None, linear, linear)
    assert torch.allclose(got, F.linear(x, dequantize(q, scale, x.dtype)))


def test_kv_values_saturate_instead_of_becoming_nan():
    x = torch.tensor([1.0, -1000.0, 500.0])
    stored = to_fp8_range(x, 1.0).to(FP8).float()
    assert torch.equal(stored, torch.tensor([1.0, -FP8_MAX, FP8_MAX]))
    assert torch.allclose(to_fp8_range(x, 4.0), torch.tensor([0.25, -250.0, 125.0]))
