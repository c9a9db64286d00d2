"""Replacement workers for lost ranks, and the rendezvous store they meet at.

The engine's process hosts torch's rendezvous store (`host_store`), so no rank's death
takes it away: a rank 0 lost is like any other, and a communicator that NCCL makes on a
plan's first use after a loss still finds the store.

torch.distributed cannot add a rank to a live communicator, and a group that lost a rank
is lost whole (its other ranks are killed: engine/faults.py). So a lost group comes back
as new processes for all its ranks (`Replacements.start`), which meet in a world of their
own at a new rendezvous generation (a new prefix of the store: parallel/world.py), make
the communicators of every plan over their ranks, load the weights and report their KV
blocks, while the groups left serve on. The engine takes the outcome (`take`) and puts the
group back in the layout, or counts a failed attempt (engine/node_healing.py)."""
import dataclasses
import datetime
import logging
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from parashift.executor.base import HostDown
from parashift.executor.node_link import NodeLink, Rejoins, RemoteRank
from parashift.executor.process_start import exit_status, worker_process
from parashift.worker.worker import worker_main

logger = logging.getLogger(__name__)


def host_store(address: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store every rank joins (port 0: a free one; `store.port` says which)."""
    return dist.TCPStore(address, port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


@dataclass
class Attempt:
    """New processes for `ranks`, started together; each rank's (process, pipe) and what
    it reported so far."""
    ranks: tuple[int, ...]
    generation: int
    started_at: float
    workers: dict = field(default_factory=dict)  # rank -> (process, pipe)
    ready: dict = field(default_factory=dict)  # rank -> its KV blocks


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: `blocks` by rank once every rank is ready, else why not."""
    ranks: tuple[int, ...]
    seconds: float
    blocks: dict | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.blocks is not None


class Replacements:
    """The attempts in progress of one executor (its local ranks only)."""

    def __init__(self, ctx, spec, heartbeats, timeout_s: float):
        self.ctx, self.spec, self.heartbeats, self.timeout_s = ctx, spec, heartbeats, timeout_s
        self.generation = 0  # the rendezvous of the start-up ranks
        self.attempts: list[Attempt] = []
        self.hosts: Hosts | None = None

    def start(self, ranks: tuple[int, ...], hosts: "Hosts | None" = None) -> None:
        """Starts a process per rank of `ranks` (another host's through its agent, `hosts`);
        they meet at a new generation."""
        self.generation += 1
        spec = dataclasses.replace(self.spec, generation=self.generation,
                                   members=tuple(sorted(ranks)))
        attempt = Attempt(tuple(sorted(ranks)), self.generation, time.monotonic())
        remote = [r for r in attempt.ranks if hosts is not None and hosts.is_remote(r)]
        for rank in attempt.ranks:
            self.heartbeats[rank] = 0.0  # "not yet beating", until its thread does
            if rank not in remote:
                parent, child = self.ctx.Pipe()
                proc = worker_process(self.ctx, worker_main,
                                      (rank, spec, child, self.heartbeats),
                                      name=f"parashift-worker-{rank}")
                proc.start()
                child.close()
                attempt.workers[rank] = (proc, parent)
        if remote:
            attempt.workers.update(hosts.start(spec, remote))
            self.hosts = hosts
        self.attempts.append(attempt)
        logger.warning("starting replacement workers for ranks %s (rendezvous generation %d)",
                       list(attempt.ranks), attempt.generation)

    def take(self) -> list[tuple[Attempt, Outcome]]:
        """The attempts that ended since the last call (without waiting): every rank ready,
        or one failed, died or timed out (then all of its ranks are killed)."""
        ended = []
        for attempt in list(self.attempts):
            outcome = self._check(attempt)
            if outcome is not None:
                self.attempts.remove(attempt)
                if not outcome.ok:
                    self.stop(attempt)
                ended.append((attempt, outcome))
        return ended

    def _check(self, attempt: Attempt) -> Outcome | None:
        seconds = time.monotonic() - attempt.started_at
        for rank, (proc, conn) in list(attempt.workers.items()):
            if rank in attempt.ready:
                continue
            if conn is None:  # another host's: its connection, once it has made it
                conn = self.hosts.rejoins.take_rank(rank)
                attempt.workers[rank] = (proc, conn)
            reason = _start_failure(rank, proc, conn, attempt)
            if reason:
                return Outcome(attempt.ranks, seconds, reason=reason)
        if len(attempt.ready) == len(attempt.ranks):
            return Outcome(attempt.ranks, seconds, blocks=dict(attempt.ready))
        if seconds > self.timeout_s:
            return Outcome(attempt.ranks, seconds, reason=f"replacement ranks "
                           f"{list(attempt.ranks)} did not start within {self.timeout_s:.0f} s")
        return None

    def stop(self, attempt: Attempt) -> None:
        for proc, conn in attempt.workers.values():
            proc.kill()
            proc.join(timeout=0 if isinstance(proc, RemoteRank) else 5)
            if conn is not None:
                conn.close()

    def shutdown(self) -> None:
        for attempt in self.attempts:
            self.stop(attempt)
        self.attempts = []


def _start_failure(rank: int, proc, conn, attempt: Attempt) -> str:
    """Why `rank` of `attempt` failed to start, or "" (it is starting, or now ready)."""
    try:
        if conn is not None and conn.poll():
            message = conn.recv()
            if message[0] == "ready":
                attempt.ready[rank] = message[1]
                return ""
            return f"replacement rank {rank} failed to start:\n{message[1]}"
    except (EOFError, OSError):
        pass
    if proc.exitcode is not None:
        return f"replacement rank {rank} died during start-up ({exit_status(proc)})"
    return ""


class Hosts:
    """The other hosts' agents, for replacements: a live one starts them (`NodeLink.
    start_ranks`); a lost host's ranks wait until its agent connects again (`Rejoins`),
    which then starts them from the replacement's spec as at start-up."""

    def __init__(self, links: list[NodeLink], topology, heartbeats, address):
        self.links = {link.node: link for link in links}
        self.topology, self.heartbeats = topology, heartbeats
        self.rejoins = Rejoins(address)

    def is_remote(self, rank: int) -> bool:
        return self.topology.host_of(rank) != 0

    def check_up(self, ranks) -> None:
        """Raises HostDown for a lost host of `ranks` whose agent has not come back."""
        for node in {self.topology.host_of(r) for r in ranks if self.is_remote(r)}:
            if self.links[node].lost and node not in self.rejoins.agents:
                raise HostDown(f"node {node} is lost: its ranks come back when "
                               f"`parashift serve --node-rank {node}` runs again")

    def start(self, spec, ranks) -> dict:
        """rank -> (its RemoteRank, None: its connection comes through `rejoins`)."""
        workers = {}
        for node in sorted({self.topology.host_of(r) for r in ranks}):
            mine = [r for r in ranks if self.topology.host_of(r) == node]
            link = self.links[node]
            if link.lost:  # the host came back: its agent starts from this spec
                conn = self.rejoins.take_agent(node)
                link = self.links[node] = NodeLink(node, conn, range(0), self.heartbeats)
                for rank in mine:
                    link.ranks[rank] = RemoteRank(rank, node, link, spec.generation)
                conn.send(spec)
                link.start()
                logger.warning("node %d is back: starting its ranks %s", node, mine)
            else:
                link.start_ranks(spec, mine)
            workers.update({rank: (link.ranks[rank], None) for rank in mine})
        return workers

    def shutdown(self, grace_s: float) -> None:
        self.rejoins.close()
