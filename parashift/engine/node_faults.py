"""Fault isolation on the node (`Node.take_losses`; faults.py says why a group is lost
whole): the groups holding a lost rank leave the layout, the groups left serve under a
policy over them alone, and the lost groups' requests move to a group that holds them.
The requests no group left can hold are returned for the engine to fail."""
import dataclasses
import logging
from typing import TYPE_CHECKING

from parashift.engine.faults import GroupDown, lost_ranks, policy_over, root_reason
from parashift.engine.policy.widths import base_replicas, layouts_by_width
from parashift.engine.replica import Replica
from parashift.engine.sequence import Sequence

if TYPE_CHECKING:
    from parashift.engine.node import Node

logger = logging.getLogger(__name__)


def isolate(node: "Node", lost: dict[int, str]) -> list[tuple[Sequence, str]]:
    """Takes every group holding a lost rank out of the layout (its other ranks are
    killed: a communicator with a dead peer is never used again); the groups left keep
    stepping and take the lost groups' requests, which are computed again from their prompt
    and the tokens already generated. Returns the requests to fail, with why. Raises
    WorkerFailure once no group is left."""
    executor = node.executor
    stepping = [plan.ranks for plan in node.layout.plans] + [
        r.ranks for r in node.replicas if r.is_left_behind and r.in_flight] + [
        plan.shared_ffn[1] for plan in node.layout.plans if plan.shared_ffn is not None]
    gone = lost_ranks(set(lost), stepping)
    root = root_reason(lost)
    executor.retire(sorted(gone - set(lost)), f"taken out with its group ({root})")
    down = tuple(GroupDown(plan.name(), plan.ranks, root) for plan in node.layout.plans
                 if gone.intersection(plan.ranks))
    seqs = [seq for replica in [r for r in node.replicas if gone.intersection(r.ranks)]
            for seq in _evict_lost(node, replica, gone)]
    node.layout = node.layout.without(gone)
    node.transitions.pending.clear()  # groups renumber; the policy asks again
    for replica in node.serving_replicas():
        replica.group = node.layout.group_of_rank(replica.ranks[0])
    node.drop_finished_left_behind()
    logger.error("groups %s lost (%s); %d group(s) serve on ranks %s", [g.plan for g in down],
                 root, len(node.layout.plans), sorted(executor.alive))
    node.faults = dataclasses.replace(node.faults, ranks_alive=len(executor.alive),
                                      groups_serving=len(node.layout.plans),
                                      groups_down=node.faults.groups_down + down)
    if not node.layout.plans:
        executor.fail(f"{root}; no group of the node is left to serve\n"
                      + "\n".join(executor.lost.values()))
    node.healing.note_lost(gone, root)
    narrow_policy(node)
    failed = [(seq, f"{root}: no group left holds its {node.need(seq)} tokens")
              for seq in sorted(seqs, key=Sequence.sort_key) if not _requeue(node, seq)]
    return failed + _take_unholdable(node, root)


def _evict_lost(node: "Node", replica: Replica, gone: set[int]) -> list[Sequence]:
    """A lost replica's requests, their steps in flight dropped; the replica leaves
    (one left behind on surviving ranks too: `drop_finished_left_behind` tells its
    ranks to forget the requests)."""
    for sched, _, _ in replica.in_flight:
        for scheduled in sched.scheduled:
            scheduled.seq.num_pending_tokens -= scheduled.samples
    replica.in_flight.clear()
    seqs = replica.scheduler.evict_all()
    for seq in seqs:
        replica.encoder.forget(seq.request_id)
        replica.num_structured -= seq.params.structured_outputs is not None
    if gone.issuperset(replica.ranks):
        replica.block_manager.unshare()
        node.replicas.remove(replica)
    return seqs


def _requeue(node: "Node", seq: Sequence) -> bool:
    """Queues a lost group's request on a surviving group that holds it (its stream goes
    on), or holds it for a merge of the groups left; False if no width left holds it."""
    node.replica_of.pop(seq.request_id, None)
    target = node.route(seq)
    if target is None and node.need(seq) <= max(node.max_context.values()):
        node.unplaced[seq.request_id] = seq  # a merge of the groups left holds it
        return True
    if target is None:
        return False
    target.scheduler.add(seq)
    target.num_structured += seq.params.structured_outputs is not None
    node.replica_of[seq.request_id] = target
    node.faults = dataclasses.replace(node.faults,
                                      requests_requeued=node.faults.requests_requeued + 1)
    return True


def _take_unholdable(node: "Node", root: str) -> list[tuple[Sequence, str]]:
    """The requests waiting for a merge that no width left holds, taken off the node."""
    longest = max(node.max_context.values())
    failed = [s for s in node.unplaced.values() if node.need(s) > longest]
    for seq in failed:
        del node.unplaced[seq.request_id]
    return [(seq, f"{root}: no group left holds its {node.need(seq)} tokens") for seq in failed]


def narrow_policy(node: "Node") -> None:
    """A policy over the groups of the layout (a forced width is dropped), and the widths
    and context they can take: with the plans whose ranks share communicators (all, until
    a group is replaced: node_healing.py)."""
    made = {name for name, plan in node.plans_by_name.items()
            if any(world.issuperset(plan.ranks) for world in node.worlds)}
    node.policy = policy_over(node.layout, node.config, node.hf_config, made)
    node.layouts_by_width = layouts_by_width(base_replicas(node.layout), made)
    node.max_context = node.max_context_by_width(check=False)
    logger.warning("policy over the groups serving: %s (layout %s)", node.policy.name,
                   node.layout.name())
