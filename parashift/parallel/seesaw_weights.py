"""Seesaw's weights on one rank: the prefill plan (e.g. PP: some layers, whole) and the
decode plan (e.g. TP: every layer, a shard) hold different parameters, of about the same
bytes. Both plans' models are built at start-up and their parameters placed in one device
arena, each at a fixed address for the life of the engine (a CUDA graph captured under a
plan stays valid), and each plan's shard is kept in pinned host memory. The first plan's
region starts at the arena's start, the second's ends at its end: with an arena of the
two sizes' sum both stay resident and a switch copies nothing (the rank keeps what both
plans need); with the larger size (the least) they overlap and a switch re-shards, copying
the new plan's shard from its pinned copy, layer by layer, on a copy stream where CUDA
exists. `prefetch` copies the part of the new region that the running plan does not use
(it may overlap the old phase's last steps); `activate` copies the rest after the drain.
`--seesaw-resident-weights` asks for the sum: no copies, no host copies kept, less KV."""
import logging
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from parashift.host_memory import check_host_memory

logger = logging.getLogger(__name__)
ALIGN = 256  # bytes: every parameter starts aligned, whatever its dtype


@dataclass
class Region:
    """One plan's parameters: their byte ranges in its region and in its host copy."""
    offset: int
    size: int
    host: torch.Tensor
    chunks: list[tuple[int, int]]  # (start, stop) byte ranges, one per layer, in order
    copied: set[int] = field(default_factory=set)  # chunks the arena holds now

    def overlaps(self, other: "Region") -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass
class Switch:
    """One activation: the bytes copied from the pinned copy, and the seconds until they
    (and the prefetch's copies before them) were on the device."""
    plan: str
    bytes: int
    seconds: float


def _unique_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    seen, out = set(), []
    for name, param in model.named_parameters():  # tied weights appear once
        if id(param) not in seen:
            seen.add(id(param))
            out.append((name, param))
    return out


def _layer_of(name: str) -> str:
    """The layer a parameter belongs to ('model.layers.3' or the module above it)."""
    parts = name.split(".")
    return ".".join(parts[:3]) if parts[1:2] == ["layers"] else ".".join(parts[:-1])


def _place(model: nn.Module) -> tuple[list[tuple[nn.Parameter, int]], list[tuple[int, int]], int]:
    """Each parameter's offset in a region, the per-layer chunks, and the region's size."""
    placed, chunks, offset, layer = [], [], 0, None
    for name, param in _unique_parameters(model):
        if layer != _layer_of(name):
            layer = _layer_of(name)
            chunks.append((offset, offset))
        placed.append((param, offset))
        offset += -(-param.nbytes // ALIGN) * ALIGN
        chunks[-1] = (chunks[-1][0], offset)
    return placed, chunks, offset


class WeightArena:
    def __init__(self, models: dict[str, nn.Module], device: torch.device,
                 arena_bytes: int | None = None, pin: bool | None = None, resident: bool = False):
        """`models`: the two plans' models by plan name, loaded, the first running first;
        `arena_bytes`: None is the least (the larger plan's bytes), or the most (both plans'
        sum: both resident) with `resident`."""
        if len(models) != 2:
            raise ValueError(f"a weight arena holds two plans, got {list(models)}")
        if any(getattr(m, "layouts", None) for model in models.values() for m in model.modules()):
            raise ValueError("a weight arena takes models before narrowed weight layouts (they "
                             "hold views of the parameters it moves)")
        placements = {name: _place(model) for name, model in models.items()}
        sizes = [size for _, _, size in placements.values()]
        least, most = max(sizes), sum(sizes)
        if resident and arena_bytes is not None:
            raise ValueError("give arena_bytes or resident, not both")
        arena_bytes = (most if resident else least) if arena_bytes is None else arena_bytes
        if not least <= arena_bytes <= most:
            raise ValueError(f"the weight arena takes {least} to {most} bytes (the larger plan, "
                             f"or both resident), got {arena_bytes}")
        both = arena_bytes == most  # both resident: the host copies only stage the first fill
        pin = (device.type == "cuda" if pin is None else pin) and not both
        if not both:
            check_host_memory({"pinned weights": most},
                              advice="; each rank pins its shard of both plans")
        self.device, self.arena = device, torch.empty(arena_bytes, dtype=torch.uint8, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.regions: dict[str, Region] = {}
        for i, (name, (placed, chunks, size)) in enumerate(placements.items()):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
            offset = 0 if i == 0 else arena_bytes - size
            for param, at in placed:
                raw = param.detach().reshape(-1).view(torch.uint8)
                host[at:at + raw.numel()].copy_(raw)
                start = offset + at
                param.data = self.arena[start:start + raw.numel()].view(param.dtype).view(param.shape)
            self.regions[name] = Region(offset, size, host, chunks)
        self.active: str | None = None
        for name in self.regions:  # the second first: where both fit it stays resident
            self.activate(name) if name == next(iter(self.regions)) else self.prefetch(name)
        self._wait()
        if both:  # nothing is copied again
            if self.stream is not None:
                self.stream.synchronize()
            for region in self.regions.values():
                region.host = torch.empty(0, dtype=torch.uint8)
        logger.info("weight arena: %.2f GiB on the device (%s), pinned host copies %.2f GiB",
                    arena_bytes / 2**30, " + ".join(f"{n} {r.size / 2**30:.2f} GiB"
                                                   for n, r in self.regions.items()),
                    self.pinned_bytes / 2**30)

    @property
    def pinned_bytes(self) -> int:
        return sum(r.host.nbytes for r in self.regions.values())

    def resident(self, name: str) -> bool:
        region = self.regions[name]
        return len(region.copied) == len(region.chunks)

    def prefetch(self, name: str) -> int:
        """Copies the layers of `name` that the running plan's region does not cover;
        returns the bytes queued (on the copy stream where there is one)."""
        running = self.regions.get(self.active) if self.active not in (None, name) else None
        return self._copy(name, lambda start, stop: running is None or not self._covers(
            running, self.regions[name].offset + start, self.regions[name].offset + stop))

    def activate(self, name: str) -> Switch:
        """Makes `name` the running plan (after the old plan's steps have drained): copies
        what of its shard the arena does not hold; the other plan loses what it shared."""
        start = time.perf_counter()
        moved = self._copy(name, lambda *_: True)
        if self.stream is not None:  # the copies' own time; the next step waits for them anyway
            self.stream.synchronize()
        self._wait()
        for other, region in self.regions.items():
            if other != name and region.overlaps(self.regions[name]):
                self._invalidate(region, self.regions[name])
        self.active = name
        return Switch(name, moved, time.perf_counter() - start)

    def _copy(self, name: str, wanted) -> int:
        region, moved = self.regions[name], 0
        for i, (start, stop) in enumerate(region.chunks):
            if i in region.copied or not wanted(start, stop):
                continue
            target = self.arena[region.offset + start:region.offset + stop]
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    target.copy_(region.host[start:stop], non_blocking=True)
            else:
                target.copy_(region.host[start:stop])
            region.copied.add(i)
            moved += stop - start
        return moved

    def _wait(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    @staticmethod
    def _covers(region: Region, start: int, stop: int) -> bool:
        return start < region.offset + region.size and region.offset < stop

    def _invalidate(self, region: Region, writer: Region) -> None:
        """Forgets the chunks of `region` that `writer`'s region overwrites."""
        region.copied = {i for i in region.copied if not self._covers(
            writer, region.offset + region.chunks[i][0], region.offset + region.chunks[i][1])}
