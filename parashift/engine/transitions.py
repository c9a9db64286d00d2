"""Transitions of the node layout on the engine's side. A policy's `Transition` waits
until the groups it involves have no step in flight (drain: the other groups keep
stepping), then every rank of those groups prepares and commits it at that step
boundary, and the groups' requests move to the groups that replace them.

What a rank does in each phase is `ModelRunner.transition`. A no-op or a re-shard keeps
each group's ranks: its requests stay with their block tables. A merge or a split
changes the partition: the new groups read their ranks' KV pool in their plan's view,
the groups' waiting requests move to them, and the running ones stay where their KV was
written, finishing in their old plan (`node_transitions._regroup`; under `recompute` they move
and are computed again, counted in the record)."""
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
    moved: int         # requests that moved (with their block tables, or waiting, or re-prefilled)
    reprefilled: int   # of those, requests computed again in their new group
    kept: int = 0      # requests that stayed where their KV was written (the KV adaptor)
    stall_s: float = 0.0  # exposed stall: from the drain's end until the groups step again
    # a seesaw re-shard's (else empty): to_decode or to_prefill; the weight bytes written into
    # its ranks' arenas and the slowest rank's seconds for them, and of those bytes the ones
    # received from peer ranks and the ones read from the pinned host copies (the rest: device
    # copies within a rank); the KV bytes its ranks wrote to the CPU tier and read back
    direction: str = ""
    weight_bytes: int = 0
    weight_s: float = 0.0
    kv_bytes_out: int = 0
    kv_bytes_in: int = 0
    weight_peer_bytes: int = 0
    weight_host_bytes: int = 0


@dataclass
class PendingTransition:
    transition: Transition
    requested_at: float


def check(transition: Transition, layout: Layout, plans_by_name: dict,
          stage_changes: bool = False) -> Layout:
    """The layout once the transition commits; refuses one this engine cannot make,
    naming why. Its target plans must have been made at start-up and cover exactly the
    ranks of its groups: the same groups for a no-op or a re-shard, one group for every two
    or more of a merge's (disjoint merges at once), several for a split's one. A re-shard
    keeps a group's pipeline stages unless the engine moves its KV between the plans
    (`stage_changes`: seesaw's CPU tier)."""
    if transition.kind not in KINDS:
        raise ValueError(f"unknown transition kind {transition.kind!r}; kinds: {KINDS}")
    groups, target = transition.groups, transition.target
    if not groups or len(set(groups)) != len(groups) or any(
            not 0 <= g < len(layout.plans) for g in groups):
        raise ValueError(f"transition over groups {groups}: the layout has "
                         f"{len(layout.plans)}")
    unknown = [name for name in target if name not in plans_by_name]
    if unknown:
        raise ValueError(f"transition target {unknown[0]} was not made at start-up")
    plans = [plans_by_name[name] for name in target]
    if transition.kind == "merge":  # one or more disjoint merges, each of two groups or more
        fits = bool(plans) and all(
            sum(set(layout.plans[g].ranks) <= set(p.ranks) for g in groups) >= 2 for p in plans)
    elif transition.kind == "split":
        fits = len(groups) == 1 and len(plans) >= 2
    else:
        fits = [sorted(p.ranks) for p in plans] == [sorted(layout.plans[g].ranks) for g in groups]
    if not fits:
        raise ValueError(f"a {transition.kind} of groups {list(groups)} cannot end in "
                         f"{list(target)}: a no-op or re-shard keeps each group's ranks, a "
                         "merge makes one group of each two or more, a split several of one")
    if transition.kind in ("merge", "split") and any(
            p.pp > 1 for p in [*plans, *(layout.plans[g] for g in groups)]):
        raise ValueError("groups with pipeline parallelism do not merge or split")
    if transition.kind in ("noop", "reshard") and not stage_changes and any(
            p.pp != layout.plans[g].pp for p, g in zip(plans, groups)):
        raise ValueError("a re-shard keeps a group's pipeline stages")
    return layout.replace(groups, tuple(plans))


def changes_partition(transition: Transition) -> bool:
    """Whether ranks change groups."""
    return transition.kind in ("merge", "split")


class Transitions:
    """The transitions the policy asked for and have not committed yet."""

    def __init__(self, stage_changes: bool = False):
        self.pending: list[PendingTransition] = []
        self.stage_changes = stage_changes  # re-shards may change pipeline stages (check)

    def request(self, transitions, layout: Layout, plans_by_name: dict) -> None:
        """Takes the transitions whose groups are not paused already. A merge or split
        renumbers the groups after it, so it is taken only alone, and nothing is taken
        while one is pending (the policy asks again in the new layout)."""
        for transition in transitions:
            if any(changes_partition(p.transition) for p in self.pending):
                return
            if changes_partition(transition) and self.pending:
                continue
            if self.paused_groups().isdisjoint(transition.groups):
                check(transition, layout, plans_by_name, self.stage_changes)
                self.pending.append(PendingTransition(transition, time.monotonic()))

    def paused_groups(self) -> set[int]:
        return {g for p in self.pending for g in p.transition.groups}

    def take_drained(self, in_flight_groups: set[int]) -> list[PendingTransition]:
        """The pending transitions whose groups have no step in flight."""
        drained = [p for p in self.pending if in_flight_groups.isdisjoint(p.transition.groups)]
        self.pending = [p for p in self.pending if p not in drained]
        return drained
