"""Seesaw's weights on one rank: the prefill plan (e.g. PP: some layers, whole) and the
decode plan (e.g. TP: every layer, a shard) hold different parameters, of about the same
bytes. Both plans' models are built at start-up and their parameters placed in one device
arena, each at a fixed address for the life of the engine (a CUDA graph captured under a
plan stays valid; parallel/arena_layout.py), and each plan's shard is kept in pinned host
memory. The first plan's region starts at the arena's start, the second's ends at its end:
with an arena of the two sizes' sum both stay resident and a switch copies nothing (the
rank keeps what both plans need); with the larger size (the least) they overlap and a
switch re-shards, layer by layer. `prefetch` fills what of the new region the running plan
does not use (it may overlap the old phase's last steps); `activate` the rest after the
drain. `--seesaw-resident-weights` asks for the sum: no copies, no host copies kept, less KV.

Where the new shard comes from: with a `PeerGroup` (the seesaw group's process group and
every rank's arena layout), from the ranks whose running plan holds those bytes: this
rank's own old region (a device copy) or a peer's, over NVLink or the gloo test group
(parallel/reshard_schedule.py plans it, parallel/peer_reshard.py runs it); the pinned
host copy serves what no rank holds and the pieces that break a cycle too large to stage.
Without one, everything comes from the pinned host copy, on a copy stream where CUDA
exists.

Start-up (parallel/weight_staging.py): each model's parameters move out of device memory
into a host copy before the arena is allocated (the device holds one model, then the
arena, never both plans' models beside it), and the first fill reads those copies. With a
peer group a host copy then keeps only what the schedules read from the host, so a rank
pins a little, not both plans' shards."""
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from parashift.host_memory import check_host_memory
from parashift.parallel.arena_layout import place, region_offsets, unique_parameters
from parashift.parallel.host_copy import HostCopy, merge_extents
from parashift.parallel.peer_reshard import PeerReshard
from parashift.parallel.reshard_schedule import RankWeights, Schedule, reshard_schedule
from parashift.parallel.weight_staging import clear_chunks, host_reads, stage
from parashift.startup_phases import StartupPhases

logger = logging.getLogger(__name__)


@dataclass
class Region:
    """One plan's parameters: their byte ranges in its region and in its host copy."""
    offset: int
    size: int
    host: HostCopy  # the bytes a switch may read from the host (all, without peers)
    chunks: list[tuple[int, int]]  # (start, stop) byte ranges, one per layer, in order
    copied: set[int] = field(default_factory=set)  # chunks the arena holds now

    def overlaps(self, other: "Region") -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass
class Moved:
    """Bytes written into the arena: all of them, and of those the ones received from
    peer ranks and the ones read from the pinned host copy (the rest: device copies on
    this rank, and zeroed padding)."""
    bytes: int = 0
    peer_bytes: int = 0
    host_bytes: int = 0

    def add(self, written: dict[str, int]) -> None:
        self.bytes += sum(written.values())
        self.peer_bytes += written.get("peer", 0)
        self.host_bytes += written.get("host", 0)


@dataclass
class Switch(Moved):
    """One activation: its bytes (`Moved`), and the seconds until they (and the
    prefetch's copies before them) were on the device."""
    plan: str = ""
    seconds: float = 0.0


@dataclass
class PeerGroup:
    """The seesaw group as the peer path sees it: its process group, this rank's global
    rank, every rank's arena at its least size (`RankWeights`, the same on every rank)
    and the staging bound per rank and direction."""
    group: object
    rank: int
    ranks: dict[int, RankWeights]
    staging_bytes: int


class WeightArena:
    def __init__(self, models: dict[str, nn.Module], device: torch.device,
                 arena_bytes: int | None = None, pin: bool | None = None, resident: bool = False,
                 peers: PeerGroup | None = None, staged: dict[str, HostCopy] | None = None,
                 reload: dict[str, Callable[[], None]] | None = None,
                 phases: StartupPhases | None = None):
        """`models`: the two plans' models by plan name, loaded, the first running first;
        `arena_bytes`: None is the least (the larger plan's bytes), or the most (both plans'
        sum: both resident) with `resident`; `peers`: re-shard from the group's ranks;
        `staged`: the host copies of models already moved out of device memory (`stage`,
        whole; taken: the dict is emptied, so each copy is freed once the arena is filled
        from it; the others are staged here, before the arena is allocated); `reload`: the
        plans whose weights their loader writes straight into the arena (the model's
        parameters already off the device: nothing staged, no round trip through the host);
        `phases`: the rank's start-up timing."""
        reload, phases = reload or {}, phases or StartupPhases()
        if len(models) != 2:
            raise ValueError(f"a weight arena holds two plans, got {list(models)}")
        if any(getattr(m, "layouts", None) for model in models.values() for m in model.modules()):
            raise ValueError("a weight arena takes models before narrowed weight layouts (they "
                             "hold views of the parameters it moves)")
        layouts = {name: place(model) for name, model in models.items()}
        sizes = [layout.size for layout in layouts.values()]
        least, most = max(sizes), sum(sizes)
        if resident and arena_bytes is not None:
            raise ValueError("give arena_bytes or resident, not both")
        if peers is not None and arena_bytes is not None:
            raise ValueError("the peer path lays out every rank's arena at its least size: "
                             "give no arena_bytes with peers")
        arena_bytes = (most if resident else least) if arena_bytes is None else arena_bytes
        if not least <= arena_bytes <= most:
            raise ValueError(f"the weight arena takes {least} to {most} bytes (the larger plan, "
                             f"or both resident), got {arena_bytes}")
        both = arena_bytes == most  # both resident: the host copies only stage the first fill
        pin = (device.type == "cuda" if pin is None else pin) and not both
        offsets = dict(zip(layouts, region_offsets(sizes, arena_bytes)))
        if set(reload) - {next(iter(models))}:
            raise ValueError("only the running plan's weights load into the arena, got "
                             f"{list(reload)}")
        with phases.phase("seesaw re-shard schedules"):
            schedules = None if both or peers is None else self._plan(peers, layouts, offsets)
        keep = self._kept(layouts, offsets, schedules, peers, both)
        with phases.phase("seesaw host copies staged"):
            hosts = self._stage(models, layouts, offsets, keep, pin,
                                {} if staged is None else staged, set(reload))
        self.device = device
        self.arena = self._allocate(arena_bytes)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.regions = {name: self._place(models[name], layout, offsets[name], hosts.pop(name))
                        for name, layout in layouts.items()}
        self.active: str | None = None
        self.peers = self.schedules = None  # none until the first fill is done
        self._prefetched: str | None = None  # the plan whose phase 1 ran
        self._models = {name: models[name] for name in reload}
        with phases.phase("seesaw arena filled"):
            self._fill(reload)
        with phases.phase("seesaw host copies kept"):
            for name, region in self.regions.items():  # only what later switches read
                if keep[name] is not None or name in reload:
                    self._keep(region, [(0, region.size)] if keep[name] is None else keep[name],
                               pin)
        if schedules is not None:
            self.schedules = schedules
            self.peers = PeerReshard(peers.group, peers.rank, self.device, peers.staging_bytes)
        logger.info("weight arena: %.2f GiB on the device (%s), pinned host copies %.2f GiB",
                    arena_bytes / 2**30, " + ".join(f"{n} {r.size / 2**30:.2f} GiB"
                                                   for n, r in self.regions.items()),
                    self.pinned_bytes / 2**30)

    def _fill(self, reload: dict[str, Callable[[], None]]) -> None:
        """The first fill: the running plan's region (by its loader, or from its host copy),
        then what of the other's lies clear of it."""
        first = next(iter(self.regions))
        if first in reload:
            reload[first]()
            self._check_placed(first, self._models.pop(first))
            region = self.regions[first]
            region.copied.update(range(len(region.chunks)))
        for name in self.regions:  # the second first: where both fit it stays resident
            self.activate(name) if name == first else self.prefetch(name)
        self._wait()
        if self.stream is not None:
            self.stream.synchronize()

    def _check_placed(self, name: str, model: nn.Module) -> None:
        """Refuses where a loader gave a parameter new storage instead of writing its bytes
        in the arena."""
        region, base = self.regions[name], self.arena.data_ptr()
        for _, param in unique_parameters(model):
            at = param.data_ptr() - base
            if param.numel() and not region.offset <= at < region.offset + region.size:
                raise RuntimeError(f"{name}'s weight loader moved a parameter out of the arena")

    def _place(self, model: nn.Module, layout, offset: int, host: HostCopy) -> Region:
        """Points `model`'s parameters at their bytes in the arena (not yet filled)."""
        params = dict(unique_parameters(model))
        for placed in layout.params:
            start = offset + placed.offset
            param = params[placed.name]
            raw = self.arena[start:start + placed.nbytes]
            param.data = raw.view(param.dtype).view(placed.shape)
        return Region(offset, layout.size, host, list(layout.chunks))

    def _keep(self, region: Region, extents: list[tuple[int, int]], pin: bool) -> None:
        """Keeps only `extents` of the region's host copy: read back from the arena where
        it holds the whole region (its staging freed first, so the two never coexist),
        else from the staging."""
        if len(region.copied) == len(region.chunks):
            region.host = HostCopy.empty()
            region.host = HostCopy.of(self.arena[region.offset:region.offset + region.size],
                                      extents, pin)
        elif region.host.extents != merge_extents(extents, region.size) or (
                pin and not region.host.pinned):
            region.host = region.host.kept(extents, pin)

    def _allocate(self, nbytes: int) -> torch.Tensor:
        """The arena, once every model's parameters have left the device."""
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    @staticmethod
    def _kept(layouts, offsets, schedules, peers, both) -> dict[str, list | None]:
        """Per plan, the region bytes its host copy keeps after the first fill: all (None)
        without peers, what the schedules read from the host with them, none if both
        stay resident."""
        if both:
            return dict.fromkeys(layouts, [])
        if schedules is None:
            return dict.fromkeys(layouts, None)
        return {new: host_reads(schedules[(old, new)], peers.rank, offsets[new])
                for old, new in schedules}

    @staticmethod
    def _stage(models, layouts, offsets, keep, pin, staged, reloaded) -> dict[str, HostCopy]:
        """Every model's host copy, the ones not `staged` moved out here (one at a time,
        the running one first): whole where kept whole or first filled from it, else what
        the first fill (the layers clear of the first plan's region) and later switches
        read; none of a `reloaded` plan (its loader fills the arena, its copy is read back
        from there). Refuses first where the host cannot hold them with the copies kept."""
        first, second = layouts
        wanted = {first: [] if first in reloaded else None,
                  second: None if keep[second] is None else
                  clear_chunks(layouts[second], offsets[second], layouts[first], offsets[first])
                  + keep[second]}

        def size(name, extents):
            return layouts[name].size if extents is None else sum(
                b - a for a, b in merge_extents(extents, layouts[name].size))
        # what stays pinned (of a copy `staged` already whole, nothing more), and what the
        # copies staged here hold at once before each shrinks to what it keeps
        kept = sum(size(n, keep[n]) for n in layouts if keep[n] is not None or n not in staged)
        peak = sum(size(n, wanted[n]) for n in layouts if n not in staged)
        check_host_memory({"pinned weights": kept, "staged weights": max(0, peak - kept)},
                          advice="; each rank pins its shard of both plans (with a peer group "
                                 "only what a switch reads from the host)")
        hosts = {}
        for name in layouts:
            if name in reloaded:
                hosts[name] = HostCopy.empty()
            else:
                hosts[name] = staged.pop(name) if name in staged else stage(
                    models[name], layouts[name], wanted[name],
                    pin and (keep[name] is None or name != first))
        return hosts

    def _plan(self, peers: PeerGroup, layouts, offsets) -> dict:
        """The peer path's schedules, every switch's, planned now (every rank plans the
        same)."""
        mine = peers.ranks[peers.rank]
        if mine.layouts != layouts or mine.offsets != offsets:
            raise ValueError(f"rank {peers.rank}'s arena is not laid out as the group's plan "
                             "of it says (the structure-only models differ from the loaded ones)")
        first, second = layouts
        schedules = {(old, new): reshard_schedule(peers.ranks, old, new, peers.staging_bytes)
                     for old, new in ((first, second), (second, first))}
        for (old, new), schedule in schedules.items():
            into = schedule.bytes_into(peers.rank)
            logger.info("weight arena, %s -> %s on rank %d: %.1f MiB from peers, %.1f MiB on "
                        "the device, %.1f MiB from the host copy (%.1f MiB no rank holds), "
                        "%d + %d rounds", old, new, peers.rank, into["peer"] / 2**20,
                        into["local"] / 2**20, into["host"] / 2**20,
                        schedule.unheld[peers.rank] / 2**20, len(schedule.phase1),
                        len(schedule.phase2))
        return schedules

    @property
    def pinned_bytes(self) -> int:
        return sum(r.host.nbytes for r in self.regions.values())

    def resident(self, name: str) -> bool:
        region = self.regions[name]
        return len(region.copied) == len(region.chunks)

    def prefetch(self, name: str) -> Moved:
        """Fills what of `name`'s region lies clear of the running plan's region: from
        peers (the schedule's phase 1), then from the host copy (chunks never filled)."""
        moved = Moved()
        schedule = self._schedule(name)
        if schedule is not None:
            moved.add(self._run(schedule.phase1, name))
            self._prefetched = name
        running = self.regions.get(self.active) if self.active not in (None, name) else None
        host = self._copy(name, lambda start, stop: running is None or not self._covers(
            running, self.regions[name].offset + start, self.regions[name].offset + stop),
            after_current=schedule is not None)
        moved.add({"host": host})
        return moved

    def activate(self, name: str) -> Switch:
        """Makes `name` the running plan (after the old plan's steps have drained): fills
        what of its shard the arena does not hold; the other plan loses what it shared."""
        start = time.perf_counter()
        moved = Moved()
        schedule = self._schedule(name)
        if schedule is not None:
            if self._prefetched != name:
                moved.add(self._run(schedule.phase1, name))
            moved.add(self._run(schedule.phase2, name))
            self.regions[name].copied.update(schedule.needed[self.peers.rank])
        self._prefetched = None
        moved.add({"host": self._copy(name, lambda *_: True, after_current=schedule is not None)})
        if self.stream is not None:  # the copies' own time; the next step waits for them anyway
            self.stream.synchronize()
        if self.device.type == "cuda" and schedule is not None:
            torch.cuda.current_stream(self.device).synchronize()
        self._wait()
        for other, region in self.regions.items():
            if other != name and region.overlaps(self.regions[name]):
                self._invalidate(region, self.regions[name])
        self.active = name
        return Switch(moved.bytes, moved.peer_bytes, moved.host_bytes, name,
                      time.perf_counter() - start)

    def _schedule(self, name: str) -> Schedule | None:
        """The peer path's schedule from the running plan to `name` (None: no peer path,
        or nothing to switch)."""
        if self.schedules is None or self.active in (None, name):
            return None
        return self.schedules[(self.active, name)]

    def _run(self, rounds, name: str) -> dict[str, int]:
        region = self.regions[name]
        return self.peers.run(rounds, self.arena, region.host, region.offset)

    def _copy(self, name: str, wanted, after_current: bool = False) -> int:
        """Copies the wanted chunks not held from the host copy; `after_current`: on the
        copy stream only once the current stream's work (a peer path's reads of the bytes
        these overwrite) is done."""
        region, moved = self.regions[name], 0
        if self.stream is not None and after_current:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for i, (start, stop) in enumerate(region.chunks):
            if i in region.copied or not wanted(start, stop):
                continue
            target = self.arena[region.offset + start:region.offset + stop]
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    target.copy_(region.host.get(start, stop), non_blocking=True)
            else:
                target.copy_(region.host.get(start, stop))
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
