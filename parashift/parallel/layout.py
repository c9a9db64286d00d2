"""The node layout: at every moment the node's ranks are partitioned into groups, and
each group runs one plan over its own ranks.

A static deployment is one layout for ever (`Layout.of(plan)`: one group per DP
replica); Shift alternates a group's plan per step; a merge or split changes the
partition. A layout is a value, like a plan."""
from dataclasses import dataclass

from parashift.parallel.plan import Plan, describe


@dataclass(frozen=True)
class Layout:
    plans: tuple[Plan, ...]  # one per group; their rank sets and `lost` partition 0..world-1
    lost: tuple[int, ...] = ()  # ranks taken out of service (their groups lost a rank)

    def __post_init__(self):
        covered = sorted([*(r for plan in self.plans for r in plan.ranks), *self.lost])
        if covered != list(range(len(covered))):
            raise ValueError(f"the groups' ranks {[list(p.ranks) for p in self.plans]} and the "
                             f"lost ranks {list(self.lost)} must cover ranks "
                             f"0-{len(covered) - 1} once each")
        if any(plan.dp != 1 for plan in self.plans):
            raise ValueError("each group's plan has dp = 1: data parallelism is several groups")

    @classmethod
    def of(cls, plan: Plan) -> "Layout":
        """One group per DP replica of `plan`, each running `plan` without its DP."""
        return cls(tuple(plan.replica(d) for d in range(plan.dp)))

    def sharing_ffn(self, mode: str) -> "Layout":
        """Every group's plan with the FFN weights shared over all the groups' ranks (SiDP)
        in `mode`."""
        ranks = tuple(r for plan in self.plans for r in plan.ranks)
        return Layout(tuple(plan.sharing_ffn(mode, ranks) for plan in self.plans), self.lost)

    @classmethod
    def parse(cls, spec: str) -> "Layout":
        """Groups in rank order, comma-separated, each a plan name without ranks:
        "tp2,single,single" is ranks 0-1 as one TP=2 group and ranks 2 and 3 alone."""
        plans, start = [], 0
        for part in spec.split(","):
            plan = Plan.parse(part.strip())
            if plan.rank_set is not None or plan.dp != 1:
                raise ValueError(f"layout group {part!r}: give a plan without ranks or dp; "
                                 "groups take the next ranks in order")
            plans.append(plan.on(tuple(range(start, start + plan.world_size))))
            start += plan.world_size
        return cls(tuple(plans))

    @property
    def world_size(self) -> int:
        return sum(plan.world_size for plan in self.plans) + len(self.lost)

    def without(self, ranks: set[int]) -> "Layout":
        """The layout once the groups holding any of `ranks` are taken out of service
        (a rank died: its group's communicators cannot be used again)."""
        lost = {r for plan in self.plans if ranks.intersection(plan.ranks) for r in plan.ranks}
        kept = tuple(plan for plan in self.plans if lost.isdisjoint(plan.ranks))
        return Layout(kept, tuple(sorted({*self.lost, *lost})))

    def group_of_rank(self, rank: int) -> int:
        for index, plan in enumerate(self.plans):
            if rank in plan.ranks:
                return index
        raise ValueError(f"rank {rank} is outside a layout of {self.world_size} ranks")

    def replace(self, groups: tuple[int, ...], targets: tuple[Plan, ...]) -> "Layout":
        """The layout with `groups` replaced by `targets`, whose ranks must be exactly the
        groups' (a merge has fewer targets than groups, a split more); groups stay in the
        order of their first rank."""
        ranks = sorted(r for g in groups for r in self.plans[g].ranks)
        if sorted(r for plan in targets for r in plan.ranks) != ranks:
            raise ValueError(f"plans {[p.name() for p in targets]} do not cover exactly the "
                             f"ranks {ranks} of groups {list(groups)}")
        kept = [plan for g, plan in enumerate(self.plans) if g not in groups]
        return Layout(tuple(sorted([*kept, *targets], key=lambda plan: min(plan.ranks))),
                      self.lost)

    def name(self) -> str:
        return ",".join(plan.name() for plan in self.plans)


def describe_layout(layout: Layout, **shape) -> str:
    """Every group's plan, as `describe` prints one."""
    lines = [f"layout {layout.name()}: {len(layout.plans)} group(s) over "
             f"{layout.world_size} ranks"]
    for index, plan in enumerate(layout.plans):
        lines.append(f"group {index}: " + describe(plan, **shape))
    return "\n".join(lines)


def coupled_groups(plans: list[Plan | None]) -> list[tuple[int, ...]]:
    """Groups (by index in `plans`, each group's next plan; None: one not made, which the
    caller refuses) whose next steps must run as one round: the replicas that share FFN
    weights in Compute-as-a-Service, where every rank of each takes part in every step. All
    of them or none must be in that mode."""
    rounds: dict[tuple[int, ...], list[int]] = {}
    for group, plan in enumerate(plans):
        if plan is not None and plan.shared_ffn is not None and plan.shared_ffn[0] == "cas":
            rounds.setdefault(plan.shared_ffn[1], []).append(group)
    for ranks, groups in rounds.items():
        if len(groups) != plans[groups[0]].ffn_replicas:
            raise ValueError(f"only some of the replicas sharing FFN weights over ranks "
                             f"{list(ranks)} were given Compute-as-a-Service: "
                             f"{[plans[g].name() for g in groups]}")
    return [tuple(groups) for groups in rounds.values()]
