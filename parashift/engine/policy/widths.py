"""The layouts a node can take by width (how many of its replicas one group merges), and
the merge or split that moves one layout towards another. Plans are named as in
`Plan.name()`; only plans made at start-up can be named."""
from parashift.engine.policy.protocol import Transition
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def base_replicas(layout: Layout) -> list[Plan]:
    """The replicas a layout's groups are made of (a merged group counts its replicas)."""
    return [r for plan in layout.plans for r in (plan.split() if plan.merge_base else [plan])]


def width_of(plan: Plan) -> int:
    return plan.merge_base[0] if plan.merge_base else 1


def uniform_layout(replicas: list[Plan], width: int) -> tuple[str, ...] | None:
    """Every aligned group of `width` consecutive replicas merged, the replicas after the
    last whole group as they are; None where these replicas cannot merge so."""
    if width == 1:
        return tuple(plan.name() for plan in replicas)
    whole = len(replicas) // width * width
    try:
        groups = [Plan.merged(replicas[i:i + width]) for i in range(0, whole, width)]
    except ValueError:  # not plain replicas of one TP degree
        return None
    return tuple(plan.name() for plan in [*groups, *replicas[whole:]]) if groups else None


def layouts_by_width(replicas: list[Plan], made: set[str]) -> dict[int, tuple[str, ...]]:
    """The uniform layout of each width whose plans were all made at start-up."""
    layouts = {}
    for width in range(1, len(replicas) + 1):
        names = uniform_layout(replicas, width)
        if names is not None and set(names) <= made:
            layouts[width] = names
    return layouts


def transition_towards(current: tuple[str, ...], target: tuple[str, ...],
                       at_once: bool = False) -> Transition | None:
    """One transition that moves the layout named `current` towards `target` (None once
    there): first a merge of current groups inside a target group (`at_once`: every such
    merge, as one transition, so that no group steps alone in between to be computed
    again), else a split of a current group no target group contains, into the target
    groups inside it (or into its replicas where those do not cover it)."""
    plans = [Plan.parse(name) for name in current]
    goal = [Plan.parse(name) for name in target]
    merges = {}
    for plan in goal:
        covered = [g for g, group in enumerate(plans) if set(group.ranks) <= set(plan.ranks)]
        if len(covered) > 1:
            merges[plan.name()] = covered
            if not at_once:
                break
    if merges:
        return Transition("merge", tuple(sorted(g for gs in merges.values() for g in gs)),
                          tuple(merges))
    for g, group in enumerate(plans):
        ranks = set(group.ranks)
        if any(ranks <= set(plan.ranks) for plan in goal):
            continue
        parts = [plan for plan in goal if set(plan.ranks) < ranks]
        if sorted(r for plan in parts for r in plan.ranks) != sorted(ranks):
            parts = group.split()
        return Transition("split", (g,), tuple(plan.name() for plan in parts))
    return None


def layout_report(layout: Layout, forced: int | None, layouts: dict[int, tuple[str, ...]],
                  max_context: dict[int, int]) -> dict:
    """The layout as `GET /v1/parallel/layout` returns it."""
    return {
        "groups": [{"ranks": list(plan.ranks), "plan": plan.name(), "width": width_of(plan)}
                   for plan in layout.plans],
        "forced_width": forced,
        "widths": [{"width": width, "plans": list(names), "max_context": max_context[width]}
                   for width, names in sorted(layouts.items())],
    }
