"""The node as policies see it (`Node.view`): one view per group of the layout, made of its
replicas' counters, with what the flying and Seesaw policies read besides."""
import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from parashift.engine.policy import GroupView, NodeView
from parashift.engine.replica import Replica, combine_views

if TYPE_CHECKING:
    from parashift.engine.node import Node


def node_view(node: "Node") -> NodeView:
    """One view per group of the layout (a group with pipeline parallelism serves several
    replicas: their counters are added up)."""
    now = time.monotonic()
    views: list[list[GroupView]] = [[] for _ in node.layout.plans]
    requests = getattr(node.policy, "reads_requests", False)
    for replica in node.serving_replicas():
        view = replica.view(now)
        if replica.scheduler.gate is not None:
            view = _tier_counters(node, replica, view)
        views[replica.group].append(_request_counters(node, replica, view) if requests else view)
    groups = [combine_views(v) for v in views]
    for replica in node.replicas:
        if replica.is_left_behind and replica.scheduler.num_running:
            _count_left_behind(node, replica, groups)
    return NodeView(tuple(groups), now,
                    tuple(plan.name() for plan in node.layout.plans),
                    tuple(node.max_context.items()),
                    max(map(node.need, node.unplaced.values()), default=0),
                    tuple((plan, statistics.median(steps))
                          for plan, steps in sorted(node.decode_s.items())))


def _count_left_behind(node: "Node", replica: Replica, groups: list[GroupView]) -> None:
    """A replica left behind still runs its requests on its ranks: they count as the
    running load of the group on its first rank (else a split that leaves them behind
    shows the policy an idle node, which merges and splits again without end). Its ranks
    are in the layout: a lost rank's replicas lose their requests (node_faults.py)."""
    group = node.layout.group_of_rank(replica.ranks[0])
    running = groups[group].num_running + replica.scheduler.num_running
    groups[group] = dataclasses.replace(groups[group], num_running=running)


def _request_counters(node: "Node", replica: Replica, view: GroupView) -> GroupView:
    """The view with what the flying policy reads of its requests (a pass over them, for
    policies with `reads_requests` only). `recompute_tokens`: what its running requests
    would compute again if a merge or split moved them."""
    running, plan = replica.scheduler.running, node.layout.plans[replica.group].name()
    needs = [node.need(seq) for seq in [*running, *replica.scheduler.waiting]]
    return dataclasses.replace(
        view, kv_capacity=replica.scheduler.config.max_model_len,
        longest_need=max(needs, default=0),
        longest_decode_left=max((node.need(s) - s.num_tokens for s in running), default=0),
        waiting_decode_most=max((node.need(s) - s.num_prompt_tokens
                                 for s in replica.scheduler.waiting), default=0),
        recompute_tokens=sum(s.num_computed_tokens for s in running),
        step_s=node.last_step_s.get(plan, 0.0),
        prefill_tokens_per_s=node.prefill_rate.get(plan, 0.0))


def _tier_counters(node: "Node", replica: Replica, view: GroupView) -> GroupView:
    """The view with its seesaw group's tier: its fill, the room for its next prompt and
    the tokens that prompt's slot takes; and the prompt tokens its running requests
    still compute (read in the prefill phase only)."""
    tier = node.seesaw[tuple(sorted(replica.ranks))]
    waiting = replica.scheduler.waiting
    first = waiting[0] if waiting else None
    left = sum(max(0, s.num_prompt_tokens - s.num_computed_tokens)
               for s in replica.scheduler.running) if tier.gate.prefill else 0
    return dataclasses.replace(
        view, cpu_tier_fill=tier.slots.fill, cpu_tier_free_run=tier.free_run(first),
        next_prompt_tokens=node.need(first) if first is not None else 0,
        prompt_tokens_left=left)
