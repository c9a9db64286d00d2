"""One rank's part of a re-shard schedule's rounds (parallel/reshard_schedule.py), over the
seesaw group's process group: each round stages the sources this rank reads (for its
peers and for itself) into a contiguous send buffer, exchanges the staged bytes with
`batch_isend_irecv` (NCCL on GPUs, gloo on CPUs), one message per peer and direction,
then writes every destination of this rank: from the receive buffer, the send buffer
(its own pieces), the pinned host copy, or zeros. Both buffers are allocated once, of
the schedule's staging bound. Bytes are copied as integers of the parameter's element
size, so a copy is exact whatever the dtype. Every rank of the group runs every round
(a rank with nothing to send or receive in one only waits its turn), in schedule order,
so each pair's sends and receives match without a word exchanged."""
import torch
import torch.distributed as dist

from parashift.parallel.reshard_schedule import KINDS, Side, Transfer

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def side_view(storage: torch.Tensor, side: Side, base: int = 0) -> torch.Tensor:
    """The box of `side` in `storage` (uint8; the arena, or a host copy whose first byte
    is arena byte `base`), as integers of the parameter's element size."""
    p, start = side.param, side.base - base
    whole = storage[start:start + p.nbytes].view(_INT_OF_SIZE[p.itemsize]).view(p.shape)
    return whole[tuple(slice(a, b) for a, b in side.box)]


def _segment(buffer: torch.Tensor, at: int, like: torch.Tensor) -> torch.Tensor:
    return buffer[at:at + like.numel() * like.element_size()].view(like.dtype).view(like.shape)


class PeerReshard:
    def __init__(self, group, rank: int, device: torch.device, staging_bytes: int):
        """`group`: the seesaw group's process group; `rank`: this process's global rank."""
        self.group, self.rank = group, rank
        self.send = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        self.recv = torch.empty(staging_bytes, dtype=torch.uint8, device=device)

    @property
    def nbytes(self) -> int:
        return self.send.nbytes + self.recv.nbytes

    def run(self, rounds: list[list[Transfer]], arena: torch.Tensor, host: torch.Tensor,
            host_base: int) -> dict[str, int]:
        """Runs `rounds` (the new plan's pinned host copy `host` holds arena bytes from
        `host_base`); returns the bytes this rank wrote, by kind (peer, local, host, zero)."""
        written = dict.fromkeys(KINDS, 0)
        for transfers in rounds:
            for t in self._round(transfers, arena, host, host_base):
                written[t.kind] += t.nbytes
        return written

    def _round(self, transfers: list[Transfer], arena: torch.Tensor, host: torch.Tensor,
               host_base: int) -> list[Transfer]:
        me = self.rank
        outgoing = sorted((t for t in transfers if t.src is not None and t.src.rank == me),
                          key=lambda t: t.dst.rank)  # stable: schedule order per peer
        incoming = sorted((t for t in transfers if t.kind == "peer" and t.dst.rank == me),
                          key=lambda t: t.src.rank)
        staged, sends, at = {}, {}, 0
        for t in outgoing:
            source = side_view(arena, t.src)
            staged[id(t)] = at
            _segment(self.send, at, source).copy_(source)
            start, stop = sends.get(t.dst.rank, (at, at))
            sends[t.dst.rank] = (start, at + t.nbytes)
            at += t.nbytes
        receives, at = {}, 0
        for t in incoming:
            staged[id(t)] = at
            start, _ = receives.get(t.src.rank, (at, at))
            receives[t.src.rank] = (start, at + t.nbytes)
            at += t.nbytes
        self._exchange(sends, receives)
        mine = [t for t in transfers if t.dst.rank == me]
        for t in mine:
            target = side_view(arena, t.dst)
            if t.kind == "zero":
                target.zero_()
            elif t.kind == "host":
                target.copy_(side_view(host, t.dst, host_base))
            else:
                buffer = self.send if t.kind == "local" else self.recv
                target.copy_(_segment(buffer, staged[id(t)], target))
        return mine

    def _exchange(self, sends: dict[int, tuple[int, int]],
                  receives: dict[int, tuple[int, int]]) -> None:
        ops = []
        for peer in sorted(set(sends) | set(receives)):
            if peer == self.rank:
                continue  # its own pieces stay in the send buffer
            if peer in sends:
                start, stop = sends[peer]
                ops.append(dist.P2POp(dist.isend, self.send[start:stop], peer, self.group))
            if peer in receives:
                start, stop = receives[peer]
                ops.append(dist.P2POp(dist.irecv, self.recv[start:stop], peer, self.group))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
