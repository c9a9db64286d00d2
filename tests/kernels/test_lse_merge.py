"""The LSE merge of two partial attention outputs (kernels/lse_merge.py) against an fp64
merge of the same inputs and its PyTorch twin: under the Triton interpreter on the CPU and
compiled on CUDA; the partials read in cuDNN's layouts (a KV head's query heads packed as
rows; a [heads, rows, d] output whose first rows are dropped), head counts that are no power
of two (over two programs a row), a head_dim that is none either, a side that saw no keys
(LSE -inf)."""
import pytest
import torch

from parashift.kernels import lse_merge
from tests.kernels.common import case_tests, cuda_tests, randn

# 48 heads of 96: two programs a row, the second's last 16 heads and each head's last 32
# columns masked
CASES = [dict(rows=5, kv_heads=12, group=4, d=96)]


def partials(rows, kv_heads, group, d, dtype, device):
    """(out_a, lse_a, out_b, lse_b) as [rows, kv_heads, group, d] / [rows, kv_heads, group]
    views: a packed (padded to rows + 3) and b a [heads, 2 + rows, d] tensor's last rows."""
    heads, padded = kv_heads * group, rows + 3
    packed = randn((kv_heads, padded * group * d), dtype, device, seed=1)
    out_a = packed.view(kv_heads, padded, group, d)[:, :rows].permute(1, 0, 2, 3)
    lse_a = randn((kv_heads, padded * group), "float32", device, seed=2, scale=4.0)
    lse_a = lse_a.view(kv_heads, padded, group)[:, :rows].permute(1, 0, 2)
    plain = randn((heads, (2 + rows) * d), dtype, device, seed=3).view(heads, 2 + rows, d)
    out_b = plain.view(kv_heads, group, 2 + rows, d)[:, :, 2:].permute(2, 0, 1, 3)
    lse_b = randn((heads, 2 + rows), "float32", device, seed=4, scale=4.0)
    lse_b = lse_b.view(kv_heads, group, 2 + rows)[:, :, 2:].permute(2, 0, 1)
    lse_a[0, 0, 0] = -float("inf")  # row 0's first head: no keys before the cut
    return out_a, lse_a, out_b, lse_b


def check(rows, kv_heads, group, d, dtype="float32", device="cpu"):
    out_a, lse_a, out_b, lse_b = partials(rows, kv_heads, group, d, dtype, device)
    dt = getattr(torch, dtype)
    out = lse_merge.merge(out_a, lse_a, out_b, lse_b, dt)
    assert out.shape == (rows, kv_heads * group, d) and out.is_contiguous()
    exact = lse_merge.merge_torch(*(t.double() for t in (out_a, lse_a, out_b, lse_b)),
                                  torch.float64)
    tol = 1e-5 if dt == torch.float32 else 2 * torch.finfo(dt).eps
    torch.testing.assert_close(out.double(), exact, atol=tol, rtol=tol)
    torch.testing.assert_close(out, lse_merge.merge_torch(out_a, lse_a, out_b, lse_b, dt),
                               atol=tol, rtol=tol)
    assert torch.equal(out[0, 0], out_b[0, 0, 0])  # all of it from b


test_interpreted, _ = case_tests(__name__, check, CASES)
test_cuda = cuda_tests(check, CASES + [dict(rows=300, kv_heads=8, group=4, d=128),
                                       dict(rows=7, kv_heads=2, group=3, d=16)])


def test_mismatched_partials_are_an_error():
    a = torch.zeros(3, 2, 2, 8)
    with pytest.raises(ValueError, match="do not match"):
        lse_merge.merge(a, torch.zeros(3, 2, 2), a, torch.zeros(3, 4), torch.float32)
