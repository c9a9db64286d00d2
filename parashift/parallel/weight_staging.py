"""Seesaw's weights on their way into the arena (parallel/seesaw_weights.py): a plan's
model is moved out of device memory into a host copy (parallel/host_copy.py) before the
arena is allocated, so the device holds at most one model beside what is staged, then the
arena alone, never both plans' models and the arena. Which bytes a host copy holds: all
of the plan's region without a peer group (a switch reads it whole from the host); with
one, what the first fill needs (all of the running plan, the other plan's layers clear of
the running plan's region) and what the re-shard schedules read from the host (pieces no
rank holds, cycle breakers), the latter only kept once the arena is filled. Where the
running plan's loader can write it again (`release`, then `WeightArena(reload=...)`), it
holds none of that plan: its weights are loaded into the arena, and what switches read of
them is copied out from there."""
import torch
from torch import nn

from parashift.host_memory import check_host_memory
from parashift.parallel.arena_layout import PlanLayout, overlaps, unique_parameters
from parashift.parallel.host_copy import HostCopy, merge_extents
from parashift.parallel.reshard_schedule import Schedule


def stage(model: nn.Module, layout: PlanLayout, extents: list[tuple[int, int]] | None = None,
          pin: bool = False) -> HostCopy:
    """Moves `model`'s parameters (placed by `layout`) out of device memory: the bytes of
    `extents` of its region (None: all) into a host copy; each parameter then points at its
    bytes there where the copy holds them all, else at an empty tensor until the arena
    places it. Frees the device memory the parameters held (CUDA's cache emptied)."""
    size = sum(stop - start for start, stop in
               ([(0, layout.size)] if extents is None else merge_extents(extents, layout.size)))
    check_host_memory({"staged weights": size}, advice="; each rank stages its shard of a plan")
    host = (HostCopy.whole(layout.size, pin) if extents is None
            else HostCopy(extents, layout.size, pin))
    params = dict(unique_parameters(model))
    for placed in layout.params:
        _stage_param(params[placed.name], placed.offset, host)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the arena then gets its bytes in one allocation
    return host


def release(model: nn.Module) -> None:
    """Frees `model`'s parameters' device memory, keeping their shapes and dtypes (each a
    one-element tensor's expanded view until the arena places it and a loader fills it)."""
    with torch.no_grad():
        for _, param in unique_parameters(model):
            param.data = torch.empty(1, dtype=param.dtype, device=param.device).expand(param.shape)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the arena then gets its bytes in one allocation


def _stage_param(param: nn.Parameter, offset: int, host: HostCopy) -> None:
    raw = param.detach().reshape(-1).view(torch.uint8)
    start, stop = offset, offset + raw.numel()
    for a, b in host.extents:
        a, b = max(a, start), min(b, stop)
        if a < b:
            host.get(a, b).copy_(raw[a - start:b - start])
    param.data = (host.get(start, stop).view(param.dtype).view(param.shape)
                  if host.holds(start, stop) else torch.empty(0, dtype=param.dtype))


def clear_chunks(layout: PlanLayout, offset: int, other: PlanLayout,
                 other_offset: int) -> list[tuple[int, int]]:
    """The chunks of a region at `offset` clear of another region (region bytes)."""
    return [(a, b) for a, b in layout.chunks
            if not overlaps(offset + a, offset + b, other_offset, other_offset + other.size)]


def host_reads(schedule: Schedule, rank: int, offset: int) -> list[tuple[int, int]]:
    """The region bytes (of the new plan's region at `offset`) that `rank` reads from its
    host copy in `schedule`."""
    return [(start - offset, stop - offset)
            for start, stop in (t.dst.extent() for t in schedule.transfers()
                                if t.kind == "host" and t.dst.rank == rank)]
