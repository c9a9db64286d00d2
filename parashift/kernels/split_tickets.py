"""Split-K without extra kernels: each program of an output tile stores its part of the sum
(fp32) and takes a ticket; the tile's last program to take one sums the parts in split order
(the same bits whatever order the programs ran in), finishes the tile and sets its counter
back to 0 for the next launch. Against atomic adds into a zeroed fp32 output this saves the
zeroing and the cast kernels and is bit-stable run to run.

The counters are one buffer a device and pool, all 0 between launches, shared by the kernels
that take tickets (pool "gemm": the FP8 GEMV and GEMM by output tile, kernels/silu_mul.py's
split kernel by row; pool "attention": the decode attention by row and KV head): kernels on
one stream use them one after another (under PDL a kernel touches them
only after its grid wait)."""
import torch
import triton
import triton.language as tl

MAX_TILES = 1 << 15  # output tiles of one launch that can take tickets
_counters: dict[torch.device, torch.Tensor] = {}  # pool "gemm"'s
_pools: dict[str, dict[torch.device, torch.Tensor]] = {"gemm": _counters}


def counters(device: torch.device, tiles: int, pool: str = "gemm") -> torch.Tensor | None:
    """The device's tile counters of `pool` (each 0 between launches; one buffer a pool:
    attention keeps its own) if `tiles` fit, made at the first call outside a CUDA graph
    capture (a capture's warm-up runs first); else None."""
    if tiles > MAX_TILES:
        return None
    held = _pools.setdefault(pool, {})
    if device not in held:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        held[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
        if device.type == "cuda":  # zero before any stream's launch
            torch.cuda.synchronize(device)
    return held[device]


def outputs(rows: int, n: int, dtype: torch.dtype, device: torch.device, split_k: int,
            tiles: int, tickets: bool) -> tuple[torch.Tensor, torch.Tensor | None,
                                                torch.Tensor | None]:
    """(y, parts, counters) of a launch of `tiles` output tiles: one part of K (split_k 1)
    or parts summed by tickets (where counters are at hand): y [rows, n] in dtype, parts
    [split_k, rows, n] fp32 (written before read: no zeroing) with the counters; else y
    zeroed in fp32 for atomic adds (the caller casts it), no parts or counters."""
    tile_counters = counters(device, tiles) if split_k > 1 and tickets else None
    if split_k == 1 or tile_counters is not None:
        parts = (None if tile_counters is None else
                 torch.empty(split_k, rows, n, dtype=torch.float32, device=device))
        return torch.empty(rows, n, dtype=dtype, device=device), parts, tile_counters
    return torch.zeros(rows, n, dtype=torch.float32, device=device), None, None


@triton.jit
def is_last(counter_ptr, SPLIT_K: tl.constexpr):
    """Takes the tile's ticket once this program's parts are stored: whether it is the
    tile's last program (which then calls `reset` and sums the parts)."""
    return is_last_of(counter_ptr, SPLIT_K)


@triton.jit
def is_last_of(counter_ptr, num_programs):
    """`is_last` of a tile that `num_programs` (a runtime value) programs share."""
    tl.debug_barrier()  # every thread's stores before the ticket (released with it)
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel") == num_programs - 1


@triton.jit
def reset(counter_ptr):
    """In the tile's last program: its counter back to 0, before any thread reads a part."""
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed")
    tl.debug_barrier()  # the ticket's acquire before any thread's loads


@triton.jit
def summed_parts(first_part_ptrs, plane, mask, SPLIT_K: tl.constexpr):
    """The parts summed in split order (planes `plane` elements apart, read from L2)."""
    total = tl.load(first_part_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(first_part_ptrs + s * plane, mask=mask, other=0.0,
                         cache_modifier=".cg")
    return total
