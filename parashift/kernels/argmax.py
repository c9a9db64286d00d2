"""The argmax of each row of logits [B, V] on CUDA, as torch.argmax(dim=-1) gives it: the
first index of the row's largest value, a NaN counted larger than any number.

torch's reduce kernel runs a row on one thread block at these shapes: 36 µs a decode step
for one 128,256-column bf16 row on an H200 (session 43's profile), 52 µs for 256 rows, where
the bytes take a fraction of a µs. Here each row is split over programs of BLOCK columns;
each keeps its part's (largest value, first index), and the row's last program to take a
ticket (split_tickets.py) picks among the parts in the same order, so the index is torch's
whatever order the programs ran in. The sampler's argmax-only path takes it
(layers/sampler.py; PARASHIFT_ARGMAX_KERNEL=0 keeps torch's). Measured on an H200 (bf16,
128,256 columns, benchmarks/argmax.py): 40.3 -> 7.6 µs at one row, 42.2 -> 14.6 at 64,
52.7 -> 34.1 at 256, the same indices."""
import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import pdl, split_tickets

BLOCK = 4096  # columns a program: 32 a thread at 4 warps
MAX_PARTS = 1024  # parts of a row (columns up to 4M)
ENV = "PARASHIFT_ARGMAX_KERNEL"


def enabled() -> bool:
    return switch(ENV, "1")


@triton.jit
def _first_largest(value1, index1, value2, index2):
    """tl.reduce's combine: the (value, index) torch.argmax keeps of two."""
    nan1, nan2 = value1 != value1, value2 != value2
    same = (value1 == value2) | (nan1 & nan2)
    first = (value1 > value2) | (nan1 & ~nan2) | (same & (index1 < index2))
    return tl.where(first, value1, value2), tl.where(first, index1, index2)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, part_value_ptr, part_index_ptr, counter_ptr, V, stride_x,
                   BLOCK: tl.constexpr, PARTS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl.start(USE_PDL)
    row, part, parts = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=cols < V,
                     other=-float("inf")).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    # masked columns: -inf at indices past V, so a row of -inf still gives its first column
    value, index = tl.reduce((values, cols), 0, _first_largest)
    slot = row * parts + part
    tl.store(part_value_ptr + slot, value)
    tl.store(part_index_ptr + slot, index)
    counter = counter_ptr + row
    if split_tickets.is_last(counter, parts):
        split_tickets.reset(counter)
        p = tl.arange(0, PARTS)
        part_values = tl.load(part_value_ptr + row * parts + p, mask=p < parts,
                              other=-float("inf"), cache_modifier=".cg")
        part_indices = tl.load(part_index_ptr + row * parts + p, mask=p < parts, other=V,
                               cache_modifier=".cg")
        _, row_index = tl.reduce((part_values, part_indices), 0, _first_largest)
        tl.store(out_ptr + row, row_index.to(tl.int64))


def argmax(logits: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """logits [B, V] (unit stride along V) -> [B] int64, torch.argmax(logits, dim=-1)'s
    indices, `block` columns a program; torch's own where the rows or parts do not fit the
    tickets."""
    rows, columns = logits.shape
    parts = triton.cdiv(columns, block)
    counters = split_tickets.counters(logits.device, rows) if parts <= MAX_PARTS else None
    if counters is None or logits.stride(1) != 1 or rows == 0:
        return logits.argmax(dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    part_values = torch.empty(rows, parts, dtype=torch.float32, device=logits.device)
    part_indices = torch.empty(rows, parts, dtype=torch.int32, device=logits.device)
    _argmax_kernel[(rows, parts)](logits, out, part_values, part_indices, counters, columns,
                                  logits.stride(0), BLOCK=block,
                                  PARTS=triton.next_power_of_2(parts), num_warps=4,
                                  **pdl.launch_options(logits.device))
    return out
