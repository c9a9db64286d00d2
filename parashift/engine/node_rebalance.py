"""A group back in service takes its share of the waiting requests (`Node.take_losses`).

While a group was out, its requests were queued on the groups left (node_faults.py) and the
new ones went there too; routing places a request once, when it arrives, so a group that
comes back (node_healing.py) would get only the requests that arrive after it. Once it
serves and no step is in flight (the re-forming's quiet point, node_reform.py; where the
node does not re-form, scheduling stops until the steps in flight end), the other groups'
waiting requests that hold no KV (not started, or preempted with their blocks freed) move
to it until the loads routing compares (running + waiting requests) differ by at most one,
or no waiting request is left to move. Running requests stay where their KV is; a request
swapped to a group's CPU tier stays with its KV.

Order: each group gives the head of its queue (scheduling order: priority, then arrival).
The returned group, idle, starts them at once, and every request left on a group is behind
each one it gave, so neither a more urgent nor an older request falls behind one that
was behind it."""
import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING, Callable

from parashift.engine.replica import Replica
from parashift.engine.sequence import Sequence

if TYPE_CHECKING:
    from parashift.engine.node import Node

logger = logging.getLogger(__name__)


class Rebalancing:
    def __init__(self, node: "Node"):
        self.node = node
        self.receivers: list[Replica] = []  # returned groups' replicas waiting for their share
        self.moved = 0  # requests moved, all told

    def note_returned(self, replicas: list[Replica]) -> None:
        """Replicas of groups just back in service (node_healing.py)."""
        self.receivers += replicas

    @property
    def wanted(self) -> bool:
        """Returned groups wait for their share (no step is scheduled meanwhile); while the
        node re-forms one world, that quiet point serves both."""
        return bool(self.receivers) and not self.node.reforming.wanted

    def tick(self) -> None:
        """Moves the shares once no step is in flight."""
        node = self.node
        if not self.wanted or any(r.in_flight for r in node.replicas):
            return
        serving = node.serving_replicas()
        receivers = [r for r in self.receivers if r in serving]  # (not lost again meanwhile)
        self.receivers = []
        donors = [r for r in serving if r not in receivers]
        if not receivers or not donors:
            return
        before = [r.load for r in serving]
        moves = shares(donors, receivers, lambda seq, r: node.need(seq) <=
                       r.scheduler.config.max_model_len)
        for donor, receiver, seqs in moves:
            _move(node, donor, receiver, seqs)
        count = sum(len(seqs) for _, _, seqs in moves)
        self.moved += count
        node.faults = dataclasses.replace(
            node.faults, requests_rebalanced=node.faults.requests_rebalanced + count)
        logger.warning("%d waiting request(s) moved to the group(s) back in service on ranks "
                       "%s; requests by group %s -> %s", count,
                       sorted({rank for r in receivers for rank in r.ranks}), before,
                       [r.load for r in serving])


def shares(donors: list[Replica], receivers: list[Replica],
           fits: Callable[[Sequence, Replica], bool]
           ) -> list[tuple[Replica, Replica, list[Sequence]]]:
    """(donor, receiver, its requests in scheduling order) of each move: the least-loaded
    receiver takes, one at a time, the head of the most-loaded donor's movable queue that
    it holds, while that donor holds more than one request more than it."""
    queues = {d: deque(d.scheduler.movable_waiting()) for d in donors}
    load = {r: r.load for r in [*donors, *receivers]}
    taken: dict[tuple[Replica, Replica], list[Sequence]] = {}
    while True:
        receiver = min(receivers, key=load.get)
        offers = [(d, seq) for d in donors
                  if (seq := next((s for s in queues[d] if fits(s, receiver)), None))]
        if not offers:
            break
        donor, seq = max(offers, key=lambda offer: load[offer[0]])
        if load[donor] - load[receiver] <= 1:
            break
        if queues[donor][0] is seq:  # mostly
            queues[donor].popleft()
        else:
            queues[donor].remove(seq)
        load[donor] -= 1
        load[receiver] += 1
        taken.setdefault((donor, receiver), []).append(seq)
    return [(donor, receiver, seqs) for (donor, receiver), seqs in taken.items()]


def _move(node: "Node", donor: Replica, receiver: Replica, seqs: list[Sequence]) -> None:
    """Waiting requests leave `donor` for `receiver`'s queue; the donor's ranks forget
    the ones they were sent (preempted ones) with its next step."""
    donor.scheduler.take_waiting(seqs)
    for seq in seqs:
        donor.encoder.forget(seq.request_id)
        structured = seq.params.structured_outputs is not None
        donor.num_structured -= structured
        receiver.num_structured += structured
        receiver.scheduler.add(seq)
        node.replica_of[seq.request_id] = receiver
