"""One rank's part of a re-shard schedule's rounds (parallel/reshard_schedule.py), over the
seesaw group's process group: each round stages the sources this rank reads (for its
peers and for itself) into a contiguous send buffer, exchanges the staged bytes with
`batch_isend_irecv` (NCCL on GPUs, gloo on CPUs), one message per peer and direction,
then writes every destination of this rank: from the receive buffer, the send buffer
(its own pieces), the pinned host copy, or zeros. The send and receive buffers (and the
landing below) are allocated once, of the schedule's staging bound. Bytes are copied as integers of the parameter's element
size, so a copy is exact whatever the dtype. Every rank of the group runs every round
(a rank with nothing to send or receive in one only waits its turn), in schedule order,
so each pair's sends and receives match without a word exchanged.

No copy waits on the host. Reads from the pinned host copy run on a stream of their own
(on GPUs), each round's once its staging has read the bytes they overwrite (only this
rank's own staging reads its arena), so PCIe and the peer links carry bytes at once: a
contiguous box goes straight to its destination; a strided one (a column shard of a
row-major matrix) first lands its rows whole in a landing buffer and is cut out on the
device (a strided copy from host memory would be gathered by the CPU). A schedule's rounds
are turned into tensor views once and kept."""
import contextlib
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from parashift.parallel.host_copy import INT_OF_SIZE, HostCopy
from parashift.parallel.reshard_schedule import KINDS, Side, Transfer
from parashift.parallel.world import world_rank



def side_view(storage: torch.Tensor, side: Side) -> torch.Tensor:
    """The box of `side` in `storage` (uint8, the arena), as integers of the parameter's
    element size."""
    p, start = side.param, side.base
    whole = storage[start:start + p.nbytes].view(INT_OF_SIZE[p.itemsize]).view(p.shape)
    return whole[tuple(slice(a, b) for a, b in side.box)]


def _segment(buffer: torch.Tensor, at: int, like: torch.Tensor) -> torch.Tensor:
    return buffer[at:at + like.numel() * like.element_size()].view(like.dtype).view(like.shape)


@dataclass
class _Round:
    """A round's copies on this rank, as views: sources into the send buffer, the byte
    ranges exchanged per peer, then the destinations' writes."""
    stage: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    sends: dict[int, tuple[int, int]] = field(default_factory=dict)
    receives: dict[int, tuple[int, int]] = field(default_factory=dict)
    writes: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    zeros: list[torch.Tensor] = field(default_factory=list)
    host: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # strided host reads: (target, its landing, the host extent, the box in the landing)
    rows: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


class PeerReshard:
    def __init__(self, group, rank: int, device: torch.device, staging_bytes: int):
        """`group`: the seesaw group's process group; `rank`: this process's global rank."""
        self.group, self.rank = group, rank
        self.send = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        self.recv = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        self.landing = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        self.host_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._compiled: dict[int, tuple[list, list[_Round]]] = {}

    @property
    def nbytes(self) -> int:
        return self.send.nbytes + self.recv.nbytes + self.landing.nbytes

    def run(self, rounds: list[list[Transfer]], arena: torch.Tensor, host: HostCopy,
            host_base: int) -> dict[str, int]:
        """Runs `rounds` (the new plan's pinned host copy `host` holds arena bytes from
        `host_base`) on the current stream; returns the bytes this rank wrote, by kind
        (peer, local, host, zero)."""
        key = id(rounds)
        if key not in self._compiled or self._compiled[key][0] is not rounds:
            self._compiled[key] = (rounds, [self._compile(t, arena, host, host_base)
                                            for t in rounds])
        written = dict.fromkeys(KINDS, 0)
        for step in self._compiled[key][1]:
            self._run_round(step)
            for kind, n in step.written.items():
                written[kind] += n
        if self.host_stream is not None:
            torch.cuda.current_stream(self.host_stream.device).wait_stream(self.host_stream)
        return written

    def _compile(self, transfers: list[Transfer], arena: torch.Tensor, host: HostCopy,
                 host_base: int) -> _Round:
        me, step = self.rank, _Round()
        outgoing = sorted((t for t in transfers if t.src is not None and t.src.rank == me),
                          key=lambda t: t.dst.rank)  # stable: schedule order per peer
        incoming = sorted((t for t in transfers if t.kind == "peer" and t.dst.rank == me),
                          key=lambda t: t.src.rank)
        staged, at = {}, 0
        for t in outgoing:
            source = side_view(arena, t.src)
            staged[id(t)] = at
            step.stage.append((_segment(self.send, at, source), source))
            start, _ = step.sends.get(t.dst.rank, (at, at))
            step.sends[t.dst.rank] = (start, at + t.nbytes)
            at += t.nbytes
        at = 0
        for t in incoming:
            staged[id(t)] = at
            start, _ = step.receives.get(t.src.rank, (at, at))
            step.receives[t.src.rank] = (start, at + t.nbytes)
            at += t.nbytes
        for t in transfers:
            if t.dst.rank != me:
                continue
            step.written[t.kind] += t.nbytes
            if t.kind == "zero":
                step.zeros.append(side_view(arena, t.dst))
            elif t.kind == "host":
                self._add_host(step, arena, host, t.dst, host_base)
            else:
                target = side_view(arena, t.dst)
                buffer = self.send if t.kind == "local" else self.recv
                step.writes.append((target, _segment(buffer, staged[id(t)], target)))
        return step

    def _add_host(self, step: _Round, arena: torch.Tensor, host: HostCopy, side: Side,
                  base: int) -> None:
        """A host read into `side`: straight in where its box is contiguous, else its
        byte extent through the landing buffer (split along the first dim to fit)."""
        target, source = side_view(arena, side), host.box(side, base)
        if source.is_contiguous():
            step.host.append((target, source))
            return
        start, stop = side.extent()
        if stop - start > self.landing.nbytes:
            (first, last), rest = side.box[0], side.box[1:]
            if last - first < 2:  # one slab wider than the buffer: gathered on the CPU
                step.host.append((target, source))
                return
            middle = (first + last) // 2
            for half in ((first, middle), (middle, last)):
                self._add_host(step, arena, host, replace(side, box=(half,) + rest), base)
            return
        landing = self.landing[:stop - start]
        staged = landing.view(source.dtype).as_strided(source.shape, source.stride(), 0)
        step.rows.append((target, landing, host.get(start - base, stop - base), staged))

    def _run_round(self, step: _Round) -> None:
        for segment, source in step.stage:
            segment.copy_(source)
        self._host_reads(step)
        self._exchange(step.sends, step.receives)
        for target, source in step.writes:
            target.copy_(source, non_blocking=True)
        for target in step.zeros:
            target.zero_()

    def _host_reads(self, step: _Round) -> None:
        """The round's reads of the host copy, after its staging, on the host stream."""
        if not (step.host or step.rows):
            return
        stream = self.host_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for target, source in step.host:
                target.copy_(source, non_blocking=True)
            for target, landing, extent, staged in step.rows:
                landing.copy_(extent, non_blocking=True)
                target.copy_(staged)

    def _exchange(self, sends: dict[int, tuple[int, int]],
                  receives: dict[int, tuple[int, int]]) -> None:
        ops = []
        for peer in sorted(set(sends) | set(receives)):
            if peer == self.rank:
                continue  # its own pieces stay in the send buffer
            if peer in sends:
                start, stop = sends[peer]
                ops.append(dist.P2POp(dist.isend, self.send[start:stop], world_rank(peer), self.group))
            if peer in receives:
                start, stop = receives[peer]
                ops.append(dist.P2POp(dist.irecv, self.recv[start:stop], world_rank(peer), self.group))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
