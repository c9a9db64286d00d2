"""Fault isolation on the node layout: a rank that dies takes out its group, not the node.

A rank lost (dead, stopped, hung: `MultiprocExecutor`) cannot be stepped again, nor can
any rank that shares a communicator with it in a step: a collective with a dead peer
hangs or fails, and ranks run their steps in order. So every group of the layout holding
a lost rank is lost whole, and so is every rank of a replica left behind by a merge or
split (the KV adaptor) that has a step in flight on a lost rank. The engine then takes
those groups out of the layout and re-queues their requests on the groups that serve
(`Node.take_losses`, node_faults.py)."""
from dataclasses import dataclass

from parashift.engine.policy import FlyingPolicy, Policy, StaticPolicy, make_policy
from parashift.executor.base import first_line
from parashift.engine.policy.widths import base_replicas
from parashift.parallel.layout import Layout


@dataclass(frozen=True)
class GroupDown:
    """A group taken out of service: its plan, its ranks and why (the first lost rank)."""
    plan: str
    ranks: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class FaultReport:
    """What /health and /metrics say of the node's faults."""
    ranks_alive: int
    groups_serving: int
    groups_down: tuple[GroupDown, ...] = ()
    requests_requeued: int = 0  # requests moved off a lost group, computed again elsewhere
    worker_restarts: int = 0  # replacements started (engine/node_healing.py)
    recovery_seconds: float | None = None  # the last group back: from its loss to serving
    given_up: tuple[GroupDown, ...] = ()  # ranks left out after max_worker_restarts
    requests_rebalanced: int = 0  # waiting requests moved to a group back in service

    def as_json(self) -> dict:
        def groups(down):
            return [{"plan": g.plan, "ranks": list(g.ranks), "reason": g.reason} for g in down]
        return {"ranks_alive": self.ranks_alive, "groups_serving": self.groups_serving,
                "groups_down": groups(self.groups_down),
                "requests_requeued": self.requests_requeued,
                "worker_restarts": self.worker_restarts,
                "recovery_seconds": self.recovery_seconds, "given_up": groups(self.given_up),
                "requests_rebalanced": self.requests_rebalanced}


def lost_ranks(dead: set[int], stepping: list[tuple[int, ...]]) -> set[int]:
    """The ranks lost with `dead`: closed over the rank sets that step together (the
    layout's groups, replicas left behind with a step in flight)."""
    lost = set(dead)
    grown = True
    while grown:
        grown = False
        for ranks in stepping:
            if lost.intersection(ranks) and not lost.issuperset(ranks):
                lost.update(ranks)
                grown = True
    return lost


def root_reason(lost: dict[int, str]) -> str:
    """The reason to name first: a rank that was killed or crashed, before the peer whose
    collective its death broke."""
    reasons = list(lost.values())
    died = [r for r in reasons if " died (" in first_line(r) or "no heartbeat" in r]
    return first_line((died or reasons)[0])


def policy_over(layout: Layout, config, hf_config, made: set[str]) -> Policy:
    """The configured policy over the groups left, where it takes them (over the replicas
    they are made of: the flying policy needs them aligned from rank 0) and picks only plans
    made at start-up; otherwise each group keeps its plan (static)."""
    base = Layout(tuple(base_replicas(layout)), layout.lost)
    try:
        policy = make_policy(config, base, hf_config)
    except ValueError:  # e.g. the flying policy over one replica, or unaligned ones
        return StaticPolicy(layout)
    merges = base == layout or isinstance(policy, FlyingPolicy)  # it reads the merged layout
    fits = merges and {plan.name() for plan in policy.plans} <= made
    return policy if fits else StaticPolicy(layout)
