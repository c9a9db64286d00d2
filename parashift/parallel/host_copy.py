"""A plan's shard in host memory (Seesaw's weight arena, parallel/seesaw_weights.py): some
byte ranges of its arena region, or all of it, packed in one host buffer. Without a peer
group a switch reads the whole region from it; with one, only the pieces the re-shard
schedule reads from the host (what no rank holds, cycle breakers), so the rest of a plan
costs no host memory. Ranges are widened to the arena's alignment, so a parameter's box
viewed in the buffer keeps its element alignment.

Pinned copies are allocated at their size: torch's host allocator rounds a pinned buffer
up to a power of two (a 44 GiB copy would pin 64 GiB) unless told a threshold above which
it does not (and, so that no larger cached block is handed out, does not cache either)."""
from bisect import bisect_right
from itertools import accumulate

import torch

from parashift.parallel.arena_layout import ALIGN

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
EXACT_PINNED_MB = 64  # pinned buffers above this are neither rounded up nor cached


def pin_exactly() -> None:
    """Tells torch's host allocator to pin buffers above EXACT_PINNED_MB at their size,
    where this torch has the setting and nothing set it already."""
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    set_ = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if get is None or set_ is None:
        return
    current = get()
    if "pinned_max_round_threshold_mb" in current:
        return
    exact = (f"pinned_max_round_threshold_mb:{EXACT_PINNED_MB},"
             f"pinned_max_cached_size_mb:{EXACT_PINNED_MB}")
    set_(f"{current},{exact}" if current else exact)


def merge_extents(extents, size: int) -> list[tuple[int, int]]:
    """`extents` (start, stop byte ranges of a region of `size` bytes) widened to ALIGN,
    sorted and merged where they touch."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted((s // ALIGN * ALIGN, min(size, -(-e // ALIGN) * ALIGN))
                              for s, e in extents if e > s):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


class HostCopy:
    def __init__(self, extents: list[tuple[int, int]], size: int, pin: bool = False):
        """Room for `extents` of a region of `size` bytes (uninitialised)."""
        self.size = size
        self.extents = merge_extents(extents, size)
        self.starts = [start for start, _ in self.extents]
        self.at = [0, *accumulate(stop - start for start, stop in self.extents)]
        if pin:
            pin_exactly()
        self.pinned = pin and self.at[-1] > 0
        self.storage = torch.empty(self.at[-1], dtype=torch.uint8, pin_memory=self.pinned)

    @classmethod
    def whole(cls, size: int, pin: bool = False) -> "HostCopy":
        return cls([(0, size)], size, pin)

    @classmethod
    def empty(cls) -> "HostCopy":
        return cls([], 0)

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes

    def holds(self, start: int, stop: int) -> bool:
        i = bisect_right(self.starts, start) - 1
        return i >= 0 and stop <= self.extents[i][1]

    def get(self, start: int, stop: int) -> torch.Tensor:
        """Region bytes start..stop (inside one kept range) as a uint8 view."""
        if not self.holds(start, stop):
            raise KeyError(f"the host copy keeps {self.extents}, not bytes {start}..{stop}")
        i = bisect_right(self.starts, start) - 1
        at = self.at[i] + start - self.extents[i][0]
        return self.storage[at:at + stop - start]

    def box(self, side, base: int = 0) -> torch.Tensor:
        """The box of `side` (parallel/reshard_schedule.py), whose parameter's region
        bytes start at `base` + its offset, as integers of the parameter's element size."""
        start, stop = side.extent()
        p = side.param
        strides = [1] * len(p.shape)
        for dim in range(len(p.shape) - 2, -1, -1):
            strides[dim] = strides[dim + 1] * p.shape[dim + 1]
        extent = self.get(start - base, stop - base).view(INT_OF_SIZE[p.itemsize])
        return extent.as_strided([b - a for a, b in side.box], strides)

    def kept(self, extents, pin: bool) -> "HostCopy":
        """A new copy of only `extents` (each held here), filled from this one."""
        return HostCopy._filled(extents, self.size, pin, self.get)

    @staticmethod
    def of(region: torch.Tensor, extents, pin: bool) -> "HostCopy":
        """A copy of `extents` of `region` (uint8, all of a region's bytes: in the arena)."""
        return HostCopy._filled(extents, region.numel(), pin, lambda a, b: region[a:b])

    @staticmethod
    def _filled(extents, size: int, pin: bool, read) -> "HostCopy":
        out = HostCopy(extents, size, pin)
        for (start, stop), at in zip(out.extents, out.at):
            out.storage[at:at + stop - start].copy_(read(start, stop))
        return out
