"""Pulls byte ranges of weights into L2 while the decode chain's small kernels run (issue 61):
a kernel of its own, launched after a GEMM on a side stream, whose programs pull the next
GEMMs' weights into L2; those GEMMs then read what arrived from L2.

At one row a layer's norms, rotary and attention leave HBM nearly idle for ~15 µs (8B shape);
the weights are no kernel's output, so their prefetch needs no ordering against anything.
A launch takes at most two spans (a weight's byte range each: o's weight and the start of
gate_up's, say), cut in CHUNK-byte chunks, a program each, a chunk over LANES lanes, one
`cp.async.bulk.prefetch.L2` a lane (the copy engine walks the range, the thread goes on).
Under PDL (kernels/pdl.py) the kernel waits for the kernel before it and lets the next one
launch; it writes nothing a kernel reads, so the chain's results are the same bits with it and
without it. The spans come from layers/l2_prefetch.py (which weight where,
PARASHIFT_L2_PREFETCH). (A `prefetch.global.L2` a line, loads a sector, the prefetches before
the PDL wait, other chunk sizes and placements in the PDL chain all measured slower and were
removed in session 51.)"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from parashift.kernels import pdl

LANES = 128  # lanes a program: one prefetch instruction each
ALIGN = 16  # cp.async.bulk's address and size unit
CHUNK = 256 * 1024  # bytes a program


class Span(NamedTuple):
    """Bytes [first, first + count) of a contiguous tensor's storage."""
    tensor: torch.Tensor
    first: int
    count: int


@triton.jit
def _prefetch_lanes(base_ptr, first, count, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """This program's CHUNK bytes from `first` of a span of `count` bytes at base_ptr (u8),
    a part for each of LANES lanes (clipped to the span's end), one bulk prefetch a lane of
    its part; an empty part issues none."""
    PART: tl.constexpr = CHUNK // LANES
    lane = first + tl.arange(0, LANES).to(tl.int64) * PART
    size = tl.minimum(tl.maximum(count - lane, 0), PART).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; } // $0", "=r,l,r",
        [base_ptr + tl.minimum(lane, count - 1), size], dtype=tl.int32, is_pure=False,
        pack=1)


@triton.jit
def _l2_prefetch_kernel(a_ptr, a_first, a_count, a_chunks, b_ptr, b_first, b_count, chunks,
                        CHUNK: tl.constexpr, LANES: tl.constexpr, USE_PDL: tl.constexpr):
    """Chunks program, program + grid, ... of the spans' `chunks` (span a's first)."""
    pdl.start(USE_PDL)
    for c in range(tl.program_id(0), chunks, tl.num_programs(0)):
        if c < a_chunks:
            _prefetch_lanes(a_ptr + a_first, c.to(tl.int64) * CHUNK, a_count, CHUNK, LANES)
        else:
            _prefetch_lanes(b_ptr + b_first, (c - a_chunks).to(tl.int64) * CHUNK, b_count,
                            CHUNK, LANES)
    pdl.inputs_read(USE_PDL)


def programs_for(count: int, chunk: int) -> int:
    return -(-count // chunk)


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's storage from its first element as bytes (a contiguous tensor)."""
    if not tensor.is_contiguous():
        raise ValueError("an L2 prefetch span needs a contiguous tensor")
    return tensor.reshape(-1).view(torch.uint8)


def prefetch(spans: list[Span]) -> None:
    """Launches the prefetch of one or two spans (nothing where they are empty), on the
    current stream, PDL as the decode kernels launch: a program a chunk."""
    spans = [s for s in spans if s.count > 0]
    if not spans:
        return
    if len(spans) > 2:
        raise ValueError(f"an L2 prefetch launch takes at most two spans, got {len(spans)}")
    if any(s.first % ALIGN or s.count % ALIGN for s in spans):
        raise ValueError(f"an L2 prefetch span starts and ends on whole {ALIGN} bytes: "
                         f"{[(s.first, s.count) for s in spans]}")
    a = spans[0]
    b = spans[1] if len(spans) == 2 else Span(a.tensor, 0, 0)
    a_chunks = programs_for(a.count, CHUNK)
    chunks = a_chunks + programs_for(b.count, CHUNK)
    _l2_prefetch_kernel[(chunks,)](byte_view(a.tensor), a.first, a.count, a_chunks,
                                   byte_view(b.tensor), b.first, b.count, chunks, CHUNK=CHUNK,
                                   LANES=LANES, num_warps=LANES // 32,
                                   **pdl.launch_options(a.tensor.device))
