"""One torch world again after a replacement (`Node.take_losses`).

Replaced ranks meet in a world of their own (node_healing.py), so a plan over them and
another group's ranks (a merge of a restored group with another) has no communicator and
the policy leaves it out (`Node.worlds`). Once no set of ranks is being replaced and no
transition is pending, the node stops scheduling, and at the first step boundary with no
step in flight every live rank leaves its world and joins one new world with all the
others (executor.reform; requests and KV caches stay where they are): node rank = torch
rank again, every plan's communicators are made, and the policy gets its full plan set
back. Only where a plan of the policy spans two worlds: a static policy's plans each keep
to one group, so its node never stops for this. A rank lost during it calls it off: the
others keep their worlds, and the lost rank is taken like any other (its groups out,
replaced, then re-formed again). Only one host's processes re-form
(`executor.can_reform`); others keep split worlds until a restart."""
import logging
import time
from typing import TYPE_CHECKING

from parashift.engine.node_faults import narrow_policy

if TYPE_CHECKING:
    from parashift.engine.node import Node

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # the wait after a re-forming called off


class Reforming:
    def __init__(self, node: "Node"):
        self.node = node
        self.reforms = 0  # worlds re-formed
        self.seconds: float | None = None  # the last one's
        self.next_try = 0.0

    @property
    def wanted(self) -> bool:
        """The node has split worlds that a plan of its policy needs as one, and they can
        become one now (steps stop meanwhile)."""
        node = self.node
        return (len(node.worlds) > 1 and needs_one_world(node) and not node.healing.waiting
                and not node.transitions.pending and time.monotonic() >= self.next_try
                and getattr(node.executor, "can_reform", False))

    def tick(self) -> None:
        """Re-forms one world once wanted and no step is in flight."""
        node = self.node
        if not self.wanted or any(r.in_flight for r in node.replicas):
            return
        start = time.monotonic()
        members = tuple(node.executor.alive)
        if not node.executor.reform(members):
            logger.error("re-forming one world over ranks %s was called off (ranks lost: %s)",
                         list(members), sorted(set(members) - set(node.executor.alive)))
            self.next_try = time.monotonic() + RETRY_S
            return
        node.worlds = [frozenset(members)]
        self.reforms, self.seconds = self.reforms + 1, time.monotonic() - start
        logger.warning("ranks %s re-formed one world in %.2f s: every plan over them is made",
                       list(members), self.seconds)
        narrow_policy(node)


def needs_one_world(node: "Node") -> bool:
    """Whether a plan of the policy spans ranks of two worlds (e.g. Flying's merge of a
    restored group with another)."""
    return any(not any(world.issuperset(plan.ranks) for world in node.worlds)
               for plan in node.policy_plans)
