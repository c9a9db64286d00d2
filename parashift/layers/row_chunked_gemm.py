"""A long prompt's dense GEMMs as calls of at most PARASHIFT_GEMM_ROW_CHUNK rows each, into
one output (CUDA; deterministic mode has its own GEMMs and never comes here).

cuBLAS picks its kernel by the shape: on an H200 the 8B's projections at 16k-32k rows took
nvjet 192x192 tiles and ran at ~700 TFLOP/s through a long prompt's step, where at 4,096
rows (320x128 and 256x128 tiles) they ran at ~745 (`prefill_throughput.py --profile`,
2026-11-30). A call of fewer rows is the same cuBLAS call the engine makes for a shorter
prompt: each row's output is that call's bits. Read at each call (A/B runs switch it in one
process): 0 or unset, off; N > 0, rows in calls of N where a GEMM has more than N."""
import os

import torch

ENV = "PARASHIFT_GEMM_ROW_CHUNK"


def chunk_rows() -> int:
    value = os.environ.get(ENV, "0")
    if not value.isdigit():
        raise ValueError(f"{ENV}={value!r}: expected 0 (off) or the rows of a call")
    return int(value)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           rows: int) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [M, K] as calls of `rows` rows of x."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    weight_t = weight.t()
    for start in range(0, x.shape[0], rows):
        part = slice(start, start + rows)
        if bias is None:
            torch.mm(x[part], weight_t, out=out[part])
        else:
            torch.addmm(bias, x[part], weight_t, out=out[part])
    return out
