"""A long prompt's GEMMs in row chunks (layers/row_chunked_gemm.py): each chunk's rows are
the bits of one call of that chunk, the whole close to one call; `linear` takes the route only
on CUDA, past ROW_CHUNK_MIN rows and with the switch set; the switch's values."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.layers import linear as linear_layer
from parashift.layers import row_chunked_gemm

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


@pytest.mark.parametrize("bias", [False, True])
def test_each_chunk_is_one_call_of_its_rows(bias):
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(70, 96, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(48, 96, generator=gen) / 8).to(DEVICE, dtype)
    b = torch.randn(48, generator=gen).to(DEVICE, dtype) if bias else None
    out = row_chunked_gemm.linear(x, w, b, 32)  # chunks of 32, 32 and 6 rows
    for start in (0, 32, 64):
        assert torch.equal(out[start:start + 32], F.linear(x[start:start + 32], w, b))
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out, F.linear(x, w, b), atol=tol, rtol=tol)


def test_the_switch(monkeypatch):
    monkeypatch.delenv(row_chunked_gemm.ENV, raising=False)
    assert row_chunked_gemm.chunk_rows() == 0
    monkeypatch.setenv(row_chunked_gemm.ENV, "4096")
    assert row_chunked_gemm.chunk_rows() == 4096
    monkeypatch.setenv(row_chunked_gemm.ENV, "-1")
    with pytest.raises(ValueError, match="PARASHIFT_GEMM_ROW_CHUNK='-1'"):
        row_chunked_gemm.chunk_rows()


def test_linear_takes_the_route_on_cuda_past_its_rows(monkeypatch):
    calls = []
    monkeypatch.setattr(row_chunked_gemm, "linear",
                        lambda x, w, b, rows: calls.append((x.shape[0], rows)) or F.linear(x, w, b))
    monkeypatch.setattr(linear_layer, "ROW_CHUNK_MIN", 16)
    monkeypatch.setenv(row_chunked_gemm.ENV, "8")
    w = torch.randn(4, 8, device=DEVICE)
    for rows in (16, 17):
        linear_layer.linear(torch.randn(rows, 8, device=DEVICE), w, None)
    assert calls == ([(17, 8)] if DEVICE == "cuda" else [])  # 16 rows: not past the minimum
    monkeypatch.setenv(row_chunked_gemm.ENV, "0")
    linear_layer.linear(torch.randn(17, 8, device=DEVICE), w, None)
    assert len(calls) == (1 if DEVICE == "cuda" else 0)
