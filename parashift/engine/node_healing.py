"""Self-healing (`Node.take_losses`): a group lost with a rank comes back.

node_faults.py takes the groups of a lost rank out of the layout; their ranks are all gone
(a lost rank's peers are killed with it). Here each such set of ranks gets new processes
(the executor's `replace`: they meet at a new rendezvous, load the weights, report their
KV blocks), and once all of them have started, the starting layout's groups over those
ranks are back in the layout with empty replicas, and the policy sees them again.

Bounded: at most `max_worker_restarts` attempts per set of ranks in an hour (0: none, the
loss is for good, as before), a failed attempt waits before the next (1 s, doubling, at
most a minute). A set that keeps failing is given up: it stays out, named in /health.

Replaced ranks make the communicators of the plans over their own ranks only: a plan over
ranks of two such worlds (a merge of a restored group with another) is left out of the
policy (`worlds`) until the node re-forms one world (node_reform.py)."""
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parashift.engine.faults import GroupDown
from parashift.executor.base import HostDown
from parashift.engine.node_faults import narrow_policy
from parashift.engine.node_replicas import make_replica, replica_pools
from parashift.parallel.layout import Layout

if TYPE_CHECKING:
    from parashift.engine.node import Node

logger = logging.getLogger(__name__)

WINDOW_S = 3600.0  # max_worker_restarts counts the attempts of the last hour
BACKOFF_S, BACKOFF_MAX_S = 1.0, 60.0
HOST_POLL_S = 0.5  # how often to look for a lost host's agent to come back


@dataclass
class LostRanks:
    """A set of ranks to bring back: when and why it was lost, its attempts."""
    ranks: frozenset[int]
    lost_at: float
    reason: str
    attempts: deque = field(default_factory=deque)  # start times of the last hour's
    failures_in_a_row: int = 0
    next_try: float = 0.0
    starting: bool = False


class Healing:
    def __init__(self, node: "Node", max_restarts: int):
        self.node, self.max_restarts = node, max_restarts
        self.waiting: list[LostRanks] = []
        self.attempts: dict[frozenset, deque] = {}  # start times of the last hour's, by ranks
        self.given_up: tuple[GroupDown, ...] = ()
        self.restarts = 0  # attempts started
        self.recovery_s: float | None = None  # the last group's, from loss to serving

    @property
    def active(self) -> bool:
        return self.max_restarts > 0

    def note_lost(self, ranks: set[int], reason: str) -> None:
        """Ranks just taken out of the layout (node_faults.isolate)."""
        if not self.active or not ranks:
            return
        now, ranks = time.monotonic(), frozenset(ranks)
        # the attempts count for the ranks, across losses: a group that keeps dying after
        # it started is given up too
        attempts = self.attempts.setdefault(ranks, deque())
        self.waiting.append(LostRanks(ranks, now, reason, attempts, next_try=now))

    def tick(self) -> None:
        """Starts the attempts that are due, and takes those that ended."""
        if not self.waiting:
            return
        now = time.monotonic()
        for lost in [w for w in self.waiting if not w.starting and w.next_try <= now]:
            self._attempt(lost, now)
        for outcome in self.node.executor.take_replaced():
            lost = next(w for w in self.waiting if w.ranks == frozenset(outcome.ranks))
            lost.starting = False
            if outcome.ok:
                self._restore(lost)
            else:
                self._failed(lost, outcome.reason)

    def _attempt(self, lost: LostRanks, now: float) -> None:
        while lost.attempts and now - lost.attempts[0] > WINDOW_S:
            lost.attempts.popleft()
        if len(lost.attempts) >= self.max_restarts:
            return self._give_up(lost, f"{len(lost.attempts)} restarts within the hour "
                                       f"(max_worker_restarts {self.max_restarts}) were used")
        try:
            self.node.executor.replace(tuple(sorted(lost.ranks)))
        except HostDown as e:  # not an attempt: asked again in a while
            if lost.next_try == lost.lost_at:
                logger.warning("ranks %s wait for their host: %s", sorted(lost.ranks), e)
            lost.next_try = now + HOST_POLL_S
            return
        except (ValueError, OSError) as e:
            return self._give_up(lost, f"cannot start replacements: {e}")
        lost.attempts.append(now)
        self.restarts += 1
        lost.starting = True
        self._report()

    def _failed(self, lost: LostRanks, reason: str) -> None:
        lost.failures_in_a_row += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (lost.failures_in_a_row - 1))
        lost.next_try = time.monotonic() + delay
        logger.error("replacement of ranks %s failed (attempt %d): %s; next attempt in %.0f s",
                     sorted(lost.ranks), len(lost.attempts), reason.splitlines()[0], delay)
        lost.reason = reason.splitlines()[0]

    def _give_up(self, lost: LostRanks, why: str) -> None:
        self.waiting.remove(lost)
        plans = [p.name() for p in self._groups_of(lost)]
        self.given_up += (GroupDown(",".join(plans), tuple(sorted(lost.ranks)),
                                    f"given up: {why}; last: {lost.reason}"),)
        logger.error("ranks %s stay out of service: %s (last: %s)", sorted(lost.ranks), why,
                     lost.reason)
        self._report()

    def _groups_of(self, lost: LostRanks):
        """The starting layout's groups over the lost ranks (what comes back)."""
        return [p for p in self.node.config.node_layout.plans if lost.ranks.issuperset(p.ranks)]

    def _restore(self, lost: LostRanks) -> None:
        """The starting layout's groups over `lost.ranks` serve again."""
        node, now = self.node, time.monotonic()
        self.waiting.remove(lost)
        plans = self._groups_of(lost)
        ranks = {r for p in plans for r in p.ranks}
        node.worlds = [w - ranks for w in node.worlds if w - ranks] + [frozenset(ranks)]
        node.layout = Layout(tuple(sorted([*node.layout.plans, *plans],
                                          key=lambda p: min(p.ranks))),
                             tuple(sorted(set(node.layout.lost) - ranks)))
        node.transitions.pending.clear()  # groups renumber; the policy asks again
        for replica in node.serving_replicas():
            replica.group = node.layout.group_of_rank(replica.ranks[0])
        groups = [node.layout.group_of_rank(min(p.ranks)) for p in plans]
        restored = [make_replica(node, group, size, offset)
                    for group, offset, size in replica_pools(node, groups)]
        node.replicas += restored
        node.rebalancing.note_returned(restored)  # node_rebalance.py: their share of the queue
        self.recovery_s = now - lost.lost_at
        narrow_policy(node)
        logger.warning("groups %s back in service on ranks %s, %.1f s after they were lost "
                       "(%s); %d group(s) serve", [p.name() for p in plans], sorted(ranks),
                       self.recovery_s, lost.reason, len(node.layout.plans))
        self._report()

    def _report(self) -> None:
        node = self.node
        back = {r for p in node.layout.plans for r in p.ranks}
        down = tuple(g for g in node.faults.groups_down if back.isdisjoint(g.ranks))
        node.faults = dataclasses.replace(
            node.faults, ranks_alive=len(node.executor.alive),
            groups_serving=len(node.layout.plans), groups_down=down,
            worker_restarts=self.restarts, recovery_seconds=self.recovery_s,
            given_up=self.given_up)
