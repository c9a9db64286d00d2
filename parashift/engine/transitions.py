"""Transitions of the node layout on the engine's side. A policy's `Transition` waits
until the groups it involves have no step in flight (drain: the other groups keep
stepping), then every rank of those groups prepares and commits it at that step
boundary, and the groups' requests move to the groups that replace them.

What a rank does in each phase is `ModelRunner.transition`. Today a transition keeps
each group's ranks: it re-plans a group (a re-shard, or a no-op), so the requests move
with their block tables. Merges and splits change the ranks of groups; they need the
weight and KV layouts of Flying Serving and are refused here until those exist."""
import time
from dataclasses import dataclass

from parashift.engine.policy import Transition
from parashift.parallel.layout import Layout

KINDS = ("noop", "reshard", "merge", "split")


@dataclass
class TransitionRecord:
    """One committed transition: when, what, and how long each phase took."""
    time: float
    kind: str
    groups: tuple[int, ...]
    target: tuple[str, ...]
    drain_s: float     # from the policy's decision until the groups had no step in flight
    prepare_s: float   # the slowest rank's prepare
    cutover_s: float   # commit on every rank, and the requests moved
    moved: int         # requests that moved with their block tables
    reprefilled: int   # requests computed again in their new group


@dataclass
class PendingTransition:
    transition: Transition
    requested_at: float


def check(transition: Transition, layout: Layout, plan_names: set[str]) -> None:
    """Refuses a transition this engine cannot make, naming why."""
    if transition.kind not in KINDS:
        raise ValueError(f"unknown transition kind {transition.kind!r}; kinds: {KINDS}")
    if any(not 0 <= g < len(layout.plans) for g in transition.groups):
        raise ValueError(f"transition over groups {transition.groups}: the layout has "
                         f"{len(layout.plans)}")
    if transition.kind in ("merge", "split") or len(transition.target) != len(transition.groups):
        raise ValueError(f"a {transition.kind} changes the ranks of groups: it needs the "
                         "Flying Serving weight and KV layouts, not built yet")
    for name in transition.target:
        if name not in plan_names:
            raise ValueError(f"transition target {name} was not made at start-up")


def target_layout(layout: Layout, transition: Transition, plans_by_name: dict) -> Layout:
    """The layout once the transition commits; each target plan keeps its group's ranks."""
    plans = list(layout.plans)
    for group, name in zip(transition.groups, transition.target):
        plan = plans_by_name[name]
        if plan.ranks != plans[group].ranks or plan.pp != plans[group].pp:
            raise ValueError(f"transition target {name} does not run on group {group}'s ranks "
                             f"{list(plans[group].ranks)} with its {plans[group].pp} stage(s)")
        plans[group] = plan
    return Layout(tuple(plans))


class Transitions:
    """The transitions the policy asked for and have not committed yet."""

    def __init__(self):
        self.pending: list[PendingTransition] = []

    def request(self, transitions, layout: Layout, plan_names: set[str]) -> None:
        busy = self.paused_groups()
        for transition in transitions:
            if busy.isdisjoint(transition.groups):
                check(transition, layout, plan_names)
                self.pending.append(PendingTransition(transition, time.monotonic()))
                busy.update(transition.groups)

    def paused_groups(self) -> set[int]:
        return {g for p in self.pending for g in p.transition.groups}

    def take_drained(self, in_flight_groups: set[int]) -> list[PendingTransition]:
        """The pending transitions whose groups have no step in flight."""
        drained = [p for p in self.pending if in_flight_groups.isdisjoint(p.transition.groups)]
        self.pending = [p for p in self.pending if p not in drained]
        return drained
