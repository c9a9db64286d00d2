"""A Seesaw switch's weight transfers over its whole group (old plan -> new plan), the same
on every rank: a pure function of every rank's arena layout (parallel/arena_layout.py)
and of the checkpoint boxes its parameters hold (loader/weight_pieces.py), so no rank asks
another to agree.

What is filled: on each rank, the new plan's chunks (layers) that overlap the old plan's
region, the chunks the arena has lost (`WeightArena`'s bookkeeping: a chunk clear of the
other plan's region was filled once and stays). For each piece of each of their
parameters, the box of the checkpoint tensor it needs is covered by the old plan's
holdings, preferring the rank itself (a device copy), then the peer that sends least so
far (lowest rank on a tie); what no rank's old plan holds comes from the rank's pinned
host copy, and a vocabulary shard's padding is zeroed. Transfers are cut along the
checkpoint tensor's first dim to at most `piece_bytes`, so that a transfer's byte extent
in the arena is tight; a transfer whose source already sits at its destination (a shard
that both plans place at one address) is dropped.

Phase 1 (`prefetch`, the old plan still running): transfers whose destination bytes lie
clear of the old region on their rank: they overwrite nothing anyone reads. Phase 2
(`activate`, after the drain): the rest, in rounds. A round stages every source it reads
(on the source's rank, into a contiguous buffer: strided slices need one to be sent, and
a staged source may be overwritten), exchanges the staged bytes, then writes every
destination; so a transfer that reads bytes another overwrites must sit in the same round
as that writer or an earlier one. These constraints form a graph (reader -> writer, on
the bytes' rank); its strongly connected components (cycles: rank 0 overwrites what rank
1 still reads while rank 1 overwrites what rank 0 reads) must each fit one round, whose
staging is bounded by `staging_bytes` per rank and direction. A component that does not
fit is broken (parallel/transfer_graph.py) by reading some of its pieces from the pinned
host copy instead (a host read touches no arena byte, so it removes that piece's read
edges): the piece whose read the most writes wait on first, until every component fits.
Staging through a larger device buffer would keep those pieces on the peer links but
costs device memory for the engine's life; the host copy is already there and each piece
so read crosses PCIe once.
Components are packed into rounds in topological order, greedily, up to the bound."""
import heapq
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate

from parashift.parallel.pieces import Box, Piece, intersect, volume
from parashift.parallel.arena_layout import PlacedParam, PlanLayout, overlaps
from parashift.parallel.transfer_graph import break_cycles

KINDS = ("peer", "local", "host", "zero")


@dataclass(frozen=True)
class RankWeights:
    """One rank's arena as the schedule sees it: each plan's layout and region offset,
    and the pieces of each plan's parameters (plan -> parameter name -> pieces)."""
    layouts: dict[str, PlanLayout]
    offsets: dict[str, int]
    pieces: dict[str, dict[str, list[Piece]]]


@dataclass(frozen=True)
class Side:
    """A box of one parameter in one rank's arena (`base`: the parameter's byte offset)."""
    rank: int
    param: PlacedParam
    base: int
    box: Box

    @property
    def nbytes(self) -> int:
        return volume(self.box) * self.param.itemsize

    def extent(self) -> tuple[int, int]:
        """The bytes from the box's first element to its last (its strided span)."""
        first = last = 0
        stride = 1
        for (start, stop), size in zip(reversed(self.box), reversed(self.param.shape)):
            first += start * stride
            last += (stop - 1) * stride
            stride *= size
        return self.base + first * self.param.itemsize, self.base + (last + 1) * self.param.itemsize

    def contiguous(self) -> bool:
        start, stop = self.extent()
        return stop - start == self.nbytes


@dataclass(frozen=True)
class Transfer:
    """Box `full` of checkpoint tensor `tensor` into `dst`, read from `src` (None: the
    destination rank's pinned host copy of the new plan; zeros where `tensor` is None)."""
    tensor: str | None
    full: Box
    dst: Side
    src: Side | None

    @property
    def kind(self) -> str:
        if self.tensor is None:
            return "zero"
        if self.src is None:
            return "host"
        return "local" if self.src.rank == self.dst.rank else "peer"

    @property
    def nbytes(self) -> int:
        return self.dst.nbytes


@dataclass
class Schedule:
    """Rounds of transfers per phase, every rank's; and per rank the new plan's chunks it
    fills and the host bytes it reads because no rank holds them (`unheld`) or to break
    a cycle that does not fit the staging (`cycle`)."""
    phase1: list[list[Transfer]]
    phase2: list[list[Transfer]]
    needed: dict[int, list[int]]
    unheld: dict[int, int]
    cycle: dict[int, int]

    def transfers(self):
        return [t for rounds in (self.phase1, self.phase2) for r in rounds for t in r]

    def bytes_into(self, rank: int) -> dict[str, int]:
        """The bytes `rank` receives by kind (peer, local, host, zero)."""
        out = dict.fromkeys(KINDS, 0)
        for t in self.transfers():
            if t.dst.rank == rank:
                out[t.kind] += t.nbytes
        return out


@dataclass(frozen=True)
class _Holding:
    rank: int
    param: PlacedParam
    base: int
    piece: Piece


def needed_chunks(weights: RankWeights, old: str, new: str) -> list[int]:
    """The new plan's chunks that overlap the old plan's region on this rank."""
    start, stop = weights.offsets[old], weights.offsets[old] + weights.layouts[old].size
    base = weights.offsets[new]
    return [i for i, (a, b) in enumerate(weights.layouts[new].chunks)
            if overlaps(base + a, base + b, start, stop)]


def _holdings(ranks: dict[int, RankWeights], plan: str) -> dict[str, list[_Holding]]:
    """Every rank's boxes of each checkpoint tensor under `plan`, by tensor."""
    held: dict[str, list[_Holding]] = {}
    for rank in sorted(ranks):
        weights = ranks[rank]
        for param in weights.layouts[plan].params:
            for piece in weights.pieces[plan][param.name]:
                if piece.tensor is not None:
                    base = weights.offsets[plan] + param.offset
                    held.setdefault(piece.tensor, []).append(_Holding(rank, param, base, piece))
    return held


def subtract(box: Box, inner: Box) -> list[Box]:
    """`box` less `inner` (inside it), as disjoint boxes."""
    out, rest = [], list(box)
    for dim, ((b0, b1), (i0, i1)) in enumerate(zip(box, inner)):
        if b0 < i0:
            out.append(tuple(rest[:dim] + [(b0, i0)] + rest[dim + 1:]))
        if i1 < b1:
            out.append(tuple(rest[:dim] + [(i1, b1)] + rest[dim + 1:]))
        rest[dim] = (i0, i1)
    return out


def _row_parts(full: Box, itemsize: int, piece_bytes: int) -> list[Box]:
    """`full` cut along its first dim into parts of at most `piece_bytes` (a row at least)."""
    if not full:
        return [full]
    row = volume(full[1:]) * itemsize
    step = max(1, piece_bytes // max(row, 1))
    (start, stop), rest = full[0], full[1:]
    return [((r, min(r + step, stop)),) + rest for r in range(start, stop, step)]


class _Cover:
    """Covers the new plan's pieces with the old plan's holdings, appending transfers."""

    def __init__(self, ranks: dict[int, RankWeights], old: str, piece_bytes: int):
        self.held = _holdings(ranks, old)
        self.piece_bytes = piece_bytes
        self.sent = dict.fromkeys(ranks, 0)
        self.transfers: list[Transfer] = []
        self.unheld = dict.fromkeys(ranks, 0)

    def piece(self, rank: int, param: PlacedParam, base: int, piece: Piece) -> None:
        if piece.tensor is None:
            self.transfers.append(Transfer(None, (), Side(rank, param, base, piece.at), None))
            return
        remaining = [piece.full]
        order = sorted(self.held.get(piece.tensor, []),
                       key=lambda h: (h.rank != rank, self.sent[h.rank], h.rank))
        for holding in order:
            left = []
            for box in remaining:
                common = intersect(box, holding.piece.full)
                if not volume(common):
                    left.append(box)
                    continue
                for part in _row_parts(common, param.itemsize, self.piece_bytes):
                    self._add(piece, part, Side(rank, param, base, piece.to_param(part)), holding)
                left += subtract(box, common)
            remaining = left
        for box in remaining:
            for part in _row_parts(box, param.itemsize, self.piece_bytes):
                self._add(piece, part, Side(rank, param, base, piece.to_param(part)), None)

    def _add(self, piece: Piece, full: Box, dst: Side, holding: _Holding | None) -> None:
        if holding is None:
            self.unheld[dst.rank] += dst.nbytes
            self.transfers.append(Transfer(piece.tensor, full, dst, None))
            return
        src = Side(holding.rank, holding.param, holding.base, holding.piece.to_param(full))
        if src.rank == dst.rank and src.extent() == dst.extent() and src.contiguous():
            return  # both plans hold these bytes at one address
        if src.rank != dst.rank:
            self.sent[src.rank] += dst.nbytes
        self.transfers.append(Transfer(piece.tensor, full, dst, src))


def reshard_schedule(ranks: dict[int, RankWeights], old: str, new: str,
                     staging_bytes: int, piece_bytes: int | None = None) -> Schedule:
    """The transfers that switch every rank of `ranks` from `old` to `new` (see the
    module's docstring); `staging_bytes`: each rank's bound on the bytes a round stages
    to send and on those it receives; `piece_bytes`: the largest transfer (default a
    quarter of the staging)."""
    piece_bytes = piece_bytes or max(1, staging_bytes // 4)
    cover = _Cover(ranks, old, piece_bytes)
    needed = {}
    for rank in sorted(ranks):
        weights = ranks[rank]
        layout, region = weights.layouts[new], weights.offsets[new]
        needed[rank] = needed_chunks(weights, old, new)
        for chunk in needed[rank]:
            for param in layout.params_in(layout.chunks[chunk]):
                for piece in weights.pieces[new][param.name]:
                    cover.piece(rank, param, region + param.offset, piece)
    phase1, phase2 = [], []
    for t in cover.transfers:
        start, stop = t.dst.extent()
        weights = ranks[t.dst.rank]
        old_start = weights.offsets[old]
        clear = not overlaps(start, stop, old_start, old_start + weights.layouts[old].size)
        (phase1 if clear else phase2).append(t)
    cycle = dict.fromkeys(ranks, 0)
    rounds2 = _rounds(phase2, staging_bytes, cycle)
    return Schedule(_rounds(phase1, staging_bytes, cycle), rounds2, needed, cover.unheld, cycle)


def staging_demand(transfers: list[Transfer]) -> tuple[dict[int, int], dict[int, int]]:
    """Per rank, the bytes a round of these transfers stages to send (and to copy
    locally), and the bytes it receives from peers."""
    send, recv = {}, {}
    for t in transfers:
        if t.src is None:
            continue
        send[t.src.rank] = send.get(t.src.rank, 0) + t.nbytes
        if t.src.rank != t.dst.rank:
            recv[t.dst.rank] = recv.get(t.dst.rank, 0) + t.nbytes
    return send, recv


def _fits(transfers: list[Transfer], staging_bytes: int) -> bool:
    send, recv = staging_demand(transfers)
    return all(n <= staging_bytes for n in (*send.values(), *recv.values()))


def read_before_write(transfers: list[Transfer]) -> dict[int, list[int]]:
    """i -> [j...]: transfer i reads bytes (on its source's rank) that transfer j writes,
    by byte extents (a strided box's span: a superset, so an edge may be spare, never
    missing)."""
    writes: dict[int, list[tuple[int, int, int]]] = {}
    for j, t in enumerate(transfers):
        writes.setdefault(t.dst.rank, []).append((*t.dst.extent(), j))
    index = {}
    for rank, spans in writes.items():
        spans.sort()
        index[rank] = (spans, [s for s, _, _ in spans],
                       list(accumulate((e for _, e, _ in spans), max)))
    edges: dict[int, list[int]] = {i: [] for i in range(len(transfers))}
    for i, t in enumerate(transfers):
        if t.src is None or t.src.rank not in index:
            continue
        start, stop = t.src.extent()
        spans, starts, reach = index[t.src.rank]
        for k in range(bisect_right(reach, start), bisect_left(starts, stop)):
            s, e, j = spans[k]
            if j != i and s < stop and start < e:
                edges[i].append(j)
    return edges


def _rounds(transfers: list[Transfer], staging_bytes: int,
            cycle: dict[int, int]) -> list[list[Transfer]]:
    """Rounds in which no transfer reads bytes an earlier round wrote, each within the
    staging bound (see the module's docstring)."""
    transfers = list(transfers)
    edges = read_before_write(transfers)
    parts = break_cycles(transfers, edges, staging_bytes, cycle)
    part_of = {i: p for p, members in enumerate(parts) for i in members}
    after = {p: set() for p in range(len(parts))}
    waits = [0] * len(parts)
    for i, targets in edges.items():
        for j in targets:
            a, b = part_of[i], part_of[j]
            if a != b and b not in after[a]:
                after[a].add(b)
                waits[b] += 1
    ready = [(min(parts[p]), p) for p in range(len(parts)) if not waits[p]]
    heapq.heapify(ready)
    rounds, current = [], []
    while ready:
        _, p = heapq.heappop(ready)
        members = [transfers[i] for i in parts[p]]
        if current and not _fits(current + members, staging_bytes):
            rounds.append(current)
            current = []
        current += members
        for q in sorted(after[p]):
            waits[q] -= 1
            if not waits[q]:
                heapq.heappush(ready, (min(parts[q]), q))
    if current:
        rounds.append(current)
    return rounds
