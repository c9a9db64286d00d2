"""Pulls byte ranges of weights into L2 while the decode chain's small kernels run (issue 61):
a kernel of its own, placed after a GEMM (in the chain or on a side stream), whose programs
pull the next GEMMs' weights into L2; those GEMMs then read what arrived from L2.

At one row a layer's norms, rotary and attention leave HBM nearly idle for ~15 µs (8B shape);
the weights are no kernel's output, so their prefetch needs no ordering against anything.
A launch takes at most two spans (a weight's byte range each: o's weight and the start of
gate_up's, say), cut in CHUNK-byte chunks, a program each (or at most max_programs, each
looping), a chunk over LANES lanes: BULK, one `cp.async.bulk.prefetch.L2` a lane (the copy
engine walks the range, the thread goes on); LINES, a `prefetch.global.L2` a 128-byte line;
READ, a 4-byte load a 32-byte sector (sure to land, and the program lasts until it has),
their max & 0 stored to a sink word no one reads (else the compilers drop the loads). Under
PDL (kernels/pdl.py) the kernel waits for the GEMM before it (AFTER_WAIT: its traffic then
does not slow that GEMM) and lets the next kernel launch; it writes nothing a kernel reads, so
the chain's results are the same bits with it and without it. The spans come from
layers/l2_prefetch.py (which weight where, PARASHIFT_L2_PREFETCH)."""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from parashift.kernels import pdl

LINE = 128  # bytes of an L2 line: one prefetch.global.L2 each
SECTOR = 32  # bytes of an L2 sector: one 4-byte load each (READ)
LANES = 128  # lanes a program: one prefetch instruction each (BULK) or CHUNK // LANES // LINE
ALIGN = 16  # cp.async.bulk's address and size unit
KINDS = {"bulk": 0, "lines": 1, "read": 2}
_BULK, _LINES = tl.constexpr(KINDS["bulk"]), tl.constexpr(KINDS["lines"])
_LINE, _SECTOR, _ALIGN = tl.constexpr(LINE), tl.constexpr(SECTOR), tl.constexpr(ALIGN)
CHUNKS = {"bulk": 256 * 1024, "lines": 64 * 1024, "read": 64 * 1024}  # bytes a program


class Span(NamedTuple):
    """Bytes [first, first + count) of a contiguous tensor's storage."""
    tensor: torch.Tensor
    first: int
    count: int


@triton.jit
def _prefetch_lanes(base_ptr, first, count, sink_ptr, zero, CHUNK: tl.constexpr,
                    LANES: tl.constexpr, KIND: tl.constexpr):
    """This program's CHUNK bytes from `first` of a span of `count` bytes at base_ptr (u8),
    a part for each of LANES lanes (each whole lines, clipped to the span's end)."""
    PART: tl.constexpr = CHUNK // LANES
    lane = first + tl.arange(0, LANES).to(tl.int64) * PART
    if KIND == _BULK:  # one bulk prefetch a lane of its part; an empty part issues none
        size = tl.minimum(tl.maximum(count - lane, 0), PART).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; } // $0", "=r,l,r",
            [base_ptr + tl.minimum(lane, count - 1), size], dtype=tl.int32, is_pure=False,
            pack=1)
    elif KIND == _LINES:  # a line at a time; past the span's end the last line again
        LINES: tl.constexpr = PART // _LINE
        offsets = lane[:, None] + tl.arange(0, LINES)[None, :].to(tl.int64) * _LINE
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [base_ptr + tl.minimum(offsets, count - 1)],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:  # READ: a word of each 32-byte sector loaded; their max & 0 stored to the sink
        SECTORS: tl.constexpr = PART // _SECTOR  # (a use the compilers cannot drop)
        offsets = lane[:, None] + tl.arange(0, SECTORS)[None, :].to(tl.int64) * _SECTOR
        words = (base_ptr + tl.minimum(offsets, count - _ALIGN)).to(tl.pointer_type(tl.int32))
        tl.store(sink_ptr, tl.max(tl.max(tl.load(words), axis=1), axis=0) & zero)


@triton.jit
def _l2_prefetch_kernel(a_ptr, a_first, a_count, a_chunks, b_ptr, b_first, b_count, chunks,
                        sink_ptr, zero, CHUNK: tl.constexpr, LANES: tl.constexpr,
                        KIND: tl.constexpr, AFTER_WAIT: tl.constexpr, USE_PDL: tl.constexpr):
    """Chunks program, program + grid, ... of the spans' `chunks` (span a's first); READ
    stores 0 (`zero`) to sink_ptr, a word no one reads."""
    if AFTER_WAIT:
        pdl.start(USE_PDL)
    for c in range(tl.program_id(0), chunks, tl.num_programs(0)):
        if c < a_chunks:
            _prefetch_lanes(a_ptr + a_first, c.to(tl.int64) * CHUNK, a_count, sink_ptr, zero,
                            CHUNK, LANES, KIND)
        else:
            _prefetch_lanes(b_ptr + b_first, (c - a_chunks).to(tl.int64) * CHUNK, b_count,
                            sink_ptr, zero, CHUNK, LANES, KIND)
    if not AFTER_WAIT:
        pdl.start(USE_PDL)
    pdl.inputs_read(USE_PDL)


_sinks: dict[torch.device, torch.Tensor] = {}


def sink(device: torch.device) -> torch.Tensor:
    """The device's word that READ programs store 0 to (made once, outside any capture)."""
    if device not in _sinks:
        _sinks[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _sinks[device]


def programs_for(count: int, chunk: int) -> int:
    return -(-count // chunk)


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's storage from its first element as bytes (a contiguous tensor)."""
    if not tensor.is_contiguous():
        raise ValueError("an L2 prefetch span needs a contiguous tensor")
    return tensor.reshape(-1).view(torch.uint8)


def prefetch(spans: list[Span], kind: str = "bulk", after_wait: bool = True,
             chunk: int | None = None, max_programs: int | None = None) -> None:
    """Launches the prefetch of one or two spans (nothing where they are empty), on the
    current stream, PDL as the decode kernels launch: a program a chunk, or at most
    max_programs, each taking every max_programs-th chunk (fewer bytes in flight at once)."""
    spans = [s for s in spans if s.count > 0]
    if not spans:
        return
    if len(spans) > 2:
        raise ValueError(f"an L2 prefetch launch takes at most two spans, got {len(spans)}")
    if any(s.first % ALIGN or s.count % ALIGN for s in spans):
        raise ValueError(f"an L2 prefetch span starts and ends on whole {ALIGN} bytes: "
                         f"{[(s.first, s.count) for s in spans]}")
    chunk = chunk or CHUNKS[kind]
    a = spans[0]
    b = spans[1] if len(spans) == 2 else Span(a.tensor, 0, 0)
    a_chunks = programs_for(a.count, chunk)
    chunks = a_chunks + programs_for(b.count, chunk)
    grid = (min(chunks, max_programs or chunks),)
    _l2_prefetch_kernel[grid](byte_view(a.tensor), a.first, a.count, a_chunks,
                              byte_view(b.tensor), b.first, b.count, chunks,
                              sink(a.tensor.device), 0, CHUNK=chunk,
                              LANES=LANES, KIND=KINDS[kind], AFTER_WAIT=after_wait,
                              num_warps=LANES // 32, **pdl.launch_options(a.tensor.device))
