"""Batch-invariant matrix products: row i of x @ w.T comes out bit for bit the same
whatever the other rows of x, the number of rows, or the rows of w computed alongside.

On CUDA the Triton kernel of `triton_matmul.py` (one tile configuration, K in a fixed
order). On the CPU, torch's GEMMs are invariant once they always take the same path:
measured with torch 2.13 (MKL/oneDNN), one row goes through a GEMV whose sums differ from
the GEMM's, while GEMMs whose row count is a multiple of ROW_TILE agree for every row
count and output width; so rows are padded to a multiple of ROW_TILE, the operands are
made fp32 and contiguous in one canonical layout, and each K chunk is one matrix of a
batched product."""
import torch

from parashift.deterministic.k_chunks import column_chunks
from parashift.kernels import use_triton

ROW_TILE = 16


def pad_rows(x: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """x with zero rows appended along `dim` up to a multiple of ROW_TILE (at least one)."""
    rows = x.shape[dim]
    pad = max(ROW_TILE, -(-rows // ROW_TILE) * ROW_TILE) - rows
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def chunk_partials(x: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """[chunks, rows, N] fp32: partial c is x[:, K_c] @ weight[:, K_c].T over the c-th of
    `chunks` equal slices K_c of the input dimension; x is [rows, K], weight [N, K]."""
    return fold_chunks(x, weight, chunks, chunks)


def fold_chunks(x: torch.Tensor, weight: torch.Tensor, chunks: int, blocks: int,
                out: torch.Tensor | None = None, mirror: torch.Tensor | None = None
                ) -> torch.Tensor:
    """[blocks, rows, N] fp32: block b is the chunk partials of the b-th of `blocks` equal
    runs of the `chunks` K chunks added in chunk order from zero (one block per chunk: the
    partials themselves); stored in `out` and `mirror` too, where given."""
    rows, k = x.shape
    if k % chunks or chunks % blocks:
        raise ValueError(f"the input width {k} does not split into {chunks} chunks in "
                         f"{blocks} blocks")
    if use_triton(x):
        from parashift.deterministic import triton_matmul
        return triton_matmul.fold_chunks(x, weight, chunks, blocks, out, mirror)
    folded = _fold_chunks_torch(x, weight, chunks, blocks)
    for target in (out, mirror):
        if target is not None:
            target.copy_(folded)
    return folded if out is None else out


def _fold_chunks_torch(x: torch.Tensor, weight: torch.Tensor, chunks: int, blocks: int
                       ) -> torch.Tensor:
    rows, k = x.shape
    width = k // chunks
    xs = pad_rows(x.float()).unflatten(1, (chunks, width)).transpose(0, 1).contiguous()
    ws = weight.float().unflatten(1, (chunks, width)).transpose(0, 1).contiguous()
    partials = torch.bmm(xs, ws.transpose(1, 2))[:, :rows]
    if blocks == chunks:
        return partials
    return torch.stack([ordered_sum(run) for run in partials.chunk(blocks)])


def ordered_sum(partials: torch.Tensor, init: torch.Tensor | None = None,
                groups: int = 1) -> torch.Tensor:
    """The sum over dim 0 added one partial after the other, from zero (or from `init`, the
    fp32 running sum of the partials before these), in fp32. With `groups`, the partials
    fall in that many equal runs, each run is summed so from zero, then the runs' sums."""
    if groups > 1:
        if init is not None:
            raise ValueError("a grouped sum starts from zero")
        return ordered_sum(torch.stack([ordered_sum(run) for run in partials.chunk(groups)]))
    total = torch.zeros_like(partials[0]) if init is None else init.clone()
    for partial in partials:
        total += partial
    return total


def sum_chunks(partials: torch.Tensor, bias: torch.Tensor | None,
               dtype: torch.dtype, init: torch.Tensor | None = None,
               groups: int = 1) -> torch.Tensor:
    """The partials [chunks, rows, N] added in chunk order (after `init`, the running sum of
    the chunks before them, if given; in `groups` runs as `ordered_sum`), plus bias, in
    `dtype`."""
    if partials.shape[0] % groups:
        raise ValueError(f"{partials.shape[0]} partials do not fall in {groups} groups")
    if use_triton(partials):
        from parashift.deterministic import triton_matmul
        return triton_matmul.sum_chunks(partials, bias, dtype, init, groups)
    return finish(ordered_sum(partials, init, groups), bias, dtype)


def finish(total: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if bias is not None:
        total = total + bias.float()
    return total.to(dtype)


def reduce_chunks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  chunks: int, groups: int = 1) -> torch.Tensor:
    """x @ weight.T + bias with K in `chunks` chunks summed in order (in `groups` runs, as
    `ordered_sum`; one device holding every chunk), in x's dtype; x of any leading shape."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if use_triton(x2):
        from parashift.deterministic import triton_matmul
        return triton_matmul.linear(x2, weight, bias, chunks, groups=groups).unflatten(0, lead)
    return sum_chunks(chunk_partials(x2, weight, chunks), bias, x.dtype,
                      groups=groups).unflatten(0, lead)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The batch-invariant F.linear: K in `column_chunks` chunks."""
    return reduce_chunks(x, weight, bias, column_chunks(x.shape[-1]))
