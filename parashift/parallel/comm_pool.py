"""Every process group any configured plan can use, created once at start-up. Plans
may cover a subset of the node's ranks; every rank creates every group (torch needs
each rank to call new_group for every group, in the same order)."""
import logging
import resource
import time

import torch
import torch.distributed as dist

from parashift.parallel.fast_all_reduce import DEFAULT_MAX_BYTES, FastAllReduce
from parashift.parallel.pair_exchange import PairExchange
from parashift.parallel.plan import GROUP_KINDS, Plan
from parashift.parallel.state import GroupHandle, ParallelState
from parashift.parallel.topology import Topology
from parashift.parallel.world import world_ranks

logger = logging.getLogger(__name__)


class CommunicatorPool:
    def __init__(self, rank: int, world_size: int, plans: list[Plan], backend: str | None = None,
                 topology: Topology | None = None, allow_cross_host: bool = False,
                 spans: list[tuple[int, ...]] = ()):
        """With a `topology`, a TP or SP group across hosts is refused unless
        `allow_cross_host`. `spans`: rank sets that get a group too, after the plans' (a
        seesaw group's, whose ranks exchange weight shards)."""
        self.rank, self.world_size = rank, world_size
        if topology is not None:
            topology.check_plans(plans, allow_cross_host)
        self._groups: dict[tuple[int, ...], object] = {}
        self._fast: dict[tuple[int, ...], FastAllReduce] = {}
        self._pairs: dict[tuple[int, ...], PairExchange] = {}
        self._tp_pairs = {tuple(sorted(ranks)) for plan in plans for ranks in plan.groups("tp")
                          if len(ranks) == 2}
        start, rss_before = time.perf_counter(), _host_rss_bytes()
        for plan in plans:
            if max(plan.ranks) >= world_size:
                raise ValueError(f"plan {plan.name()} uses ranks outside a world of {world_size}")
            for kind in GROUP_KINDS:
                for ranks in plan.groups(kind):
                    self._create(ranks, backend)
        for ranks in spans:
            self._create(ranks, backend)
        self.startup_seconds = time.perf_counter() - start
        self.startup_host_bytes = _host_rss_bytes() - rss_before
        if rank == 0:
            logger.warning("communicator pool: %d process groups for %d plans in %.3f s, host "
                           "memory +%.1f MiB on rank 0 (NCCL communicators are made on first "
                           "use)", len(self._groups), len(plans), self.startup_seconds,
                           self.startup_host_bytes / 2**20)

    def _create(self, ranks: tuple[int, ...], backend: str | None) -> None:
        key = tuple(sorted(ranks))
        if len(key) > 1 and key not in self._groups:
            # every rank calls new_group for every group, in the same order
            self._groups[key] = dist.new_group(world_ranks(key), backend=backend)

    def enable_fast_all_reduce(self, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES,
                               pair_exchange: bool = False) -> None:
        """Sets up a symmetric-memory all-reduce for the groups of this rank that
        `rendezvous_order` can order and, with `pair_exchange`, deterministic mode's
        exchange of fp32 halves (parallel/pair_exchange.py) for its TP groups of two ranks
        (a second rendezvous of the same group). Every rank calls this after start-up,
        before any handle is made."""
        pairs = self._tp_pairs if pair_exchange else set()
        order, left_out = rendezvous_order(list(self._groups),
                                           lambda group: 2 if group in pairs else 1)
        if left_out and self.rank == 0:
            logger.warning("small all-reduces of groups %s go to NCCL: no rendezvous order "
                           "puts each at one position on all its ranks", left_out)
        for key in order:
            if self.rank in key:
                fast = FastAllReduce(self._groups[key], device, max_bytes)
                if fast.available:
                    self._fast[key] = fast
                if key in pairs:
                    pair = PairExchange(self._groups[key], device)
                    if pair.available:
                        self._pairs[key] = pair

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    def handle(self, ranks: tuple[int, ...]) -> GroupHandle:
        key = tuple(sorted(ranks))
        group = self._groups.get(key) if len(ranks) > 1 else None
        if len(ranks) > 1 and group is None:
            raise KeyError(f"no process group for ranks {ranks}: not created at start-up")
        return GroupHandle(ranks, self.rank, group, self._fast.get(key), self._pairs.get(key))

    def state_for(self, plan: Plan) -> ParallelState:
        """This rank's view of `plan`, a plan over this rank (for a shift plan, TP runs
        over SP_TP)."""
        def h(kind):
            return self.handle(plan.group_of(kind, self.rank))
        state = ParallelState(plan, self.rank, h("tp"), h("sp"), h("pp"), h("dp"),
                              self.handle(plan.vocab_group_of(self.rank)),
                              self.handle(plan.ep_group_of(self.rank)))
        if plan.shared_ffn is not None:
            state.ffn = h("ffn")
            state.ffn_shard = GroupHandle(plan.ffn_shard_ranks(), self.rank)
        return state


def rendezvous_order(groups: list[tuple[int, ...]], rendezvous=lambda group: 1
                     ) -> tuple[list[tuple[int, ...]], list]:
    """The order in which ranks set up their groups' symmetric memory, and the groups left
    out. A rank's k-th rendezvous meets its peers' k-th (torch counts them per process, not
    per group: two groups met in different positions wait on each other forever), so a
    group is taken only when each of its ranks has made as many rendezvous before it (a
    group makes `rendezvous(group)` of them); the first such group in `groups` goes next,
    until none can. Every rank computes the same."""
    taken = {rank: 0 for group in groups for rank in group}
    order, waiting = [], [g for g in groups if len(g) > 1]
    while True:
        ready = next((g for g in waiting if len({taken[r] for r in g}) == 1), None)
        if ready is None:
            return order, waiting
        waiting.remove(ready)
        order.append(ready)
        for rank in ready:
            taken[rank] += rendezvous(ready)


def _host_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
