"""Committing a transition on the node (`Node.commit_drained`): a merge or split regroups
the replicas (their running requests stay where their KV was written: the KV adaptor); a
re-shard keeps the groups and moves a Seesaw group's KV through its CPU tier."""
import logging
import time
from typing import TYPE_CHECKING

from parashift.engine.node_replicas import make_replica
from parashift.engine.replica import Replica
from parashift.engine.seesaw import SeesawTier, seesaw_stats
from parashift.engine.sequence import Sequence
from parashift.engine.transitions import TransitionRecord, changes_partition, check
from parashift.parallel.plan import Plan
from parashift.step.message import KVSwap

if TYPE_CHECKING:
    from parashift.engine.node import Node

logger = logging.getLogger(__name__)


def commit(node: "Node", pending) -> TransitionRecord:
    """The transition's ranks prepare, then commit; the node takes its new layout."""
    transition = pending.transition
    drain_s = time.monotonic() - pending.requested_at
    layout = check(transition, node.layout, node.plans_by_name, bool(node.seesaw))
    ranks = sorted(r for g in transition.groups for r in node.layout.plans[g].ranks)
    names = [layout.plans[layout.group_of_rank(r)].name() for r in ranks]
    node.epoch += 1
    moving = [] if changes_partition(transition) else [  # seesaw re-shards keep the groups
        (g, node.seesaw[tuple(sorted(layout.plans[g].ranks))]) for g in transition.groups
        if layout.plans[g] != node.layout.plans[g]
        and tuple(sorted(layout.plans[g].ranks)) in node.seesaw]
    began = time.perf_counter()
    # the KV leaves the old plan's pools for the tier, and enters the new plan's
    outs = [s for g, tier in moving for s in _seesaw_move(node, g, tier, "out", layout.plans[g])]
    stashed = sum(tier.take_stashed_bytes() for _, tier in moving)
    prepare_s = node.executor.transition(ranks, "prepare", names, node.epoch)
    start = time.perf_counter()
    ins = [s for g, tier in moving for s in _seesaw_move(node, g, tier, "in", layout.plans[g])]
    node.executor.transition(ranks, "commit", names, node.epoch)
    if changes_partition(transition):
        moved, reprefilled, kept = _regroup(node, transition.groups, layout,
                                            _preemption(node, transition))
    else:  # each group keeps its ranks: its replicas, with their block tables, run the new plan
        moved = sum(r.load for r in node.replicas if r.group in transition.groups)
        reprefilled = kept = 0
    node.layout = layout
    stall_s = time.perf_counter() - began
    record = TransitionRecord(time.time(), transition.kind, transition.groups,
                              transition.target, drain_s, prepare_s,
                              time.perf_counter() - start, moved, reprefilled, kept, stall_s,
                              **seesaw_stats(moving, outs, ins, stashed))
    for _, tier in moving:
        tier.seconds["transition"] += stall_s
    _log(record, transition, bool(moving))
    return record


def _log(record: TransitionRecord, transition, seesaw: bool) -> None:
    if seesaw:
        logger.info("seesaw %s of group(s) %s: drain %.3f s, weights %.1f MiB (%.1f from "
                    "peers, %.1f from host) in %.3f s, KV %.1f MiB out / %.1f MiB in, stall "
                    "%.3f s", record.direction, list(transition.groups), record.drain_s,
                    record.weight_bytes / 2**20, record.weight_peer_bytes / 2**20,
                    record.weight_host_bytes / 2**20, record.weight_s,
                    record.kv_bytes_out / 2**20, record.kv_bytes_in / 2**20, record.stall_s)
    else:
        logger.info("%s of group(s) %s to %s: %d request(s) moved (%d computed again), %d "
                    "kept, stall %.3f s", transition.kind, list(transition.groups),
                    ",".join(record.target), record.moved, record.reprefilled, record.kept,
                    record.stall_s)


def _seesaw_move(node: "Node", group: int, tier: SeesawTier, verb: str,
                 target: Plan) -> list[dict]:
    """One phase of a seesaw group's KV and weight moves to `target` on its ranks."""
    seqs = [seq for r in node.replicas if r.group == group for seq in r.scheduler.running]
    moves = tier.moves(tier.to_move_out(seqs) if verb == "out" else seqs)
    if verb == "in":
        tier.enter(target)
    state = "stashed" if verb == "out" else "writing" if tier.gate.prefill else "loading"
    for seq in seqs:
        if seq.request_id in tier.slots.slots:
            tier.slots.mark(seq.request_id, state)
    ranks = list(target.ranks)
    return node.executor.seesaw_move(ranks, verb, [target.name()] * len(ranks), moves,
                                     tier.handle)


def add_stashes(node: "Node", replica: Replica, sched, batch) -> None:
    """A seesaw group's step in the prefill phase also writes the KV of the prompts its
    earlier steps finished to the tier (its swaps out: seesaw takes no swap preemption)."""
    tier = node.seesaw[tuple(sorted(replica.ranks))]
    if not tier.gate.prefill:
        return
    ready = tier.stashes(replica.scheduler.running,
                         {s.seq.request_id for s in sched.scheduled})
    if ready:
        batch.swap_out = [KVSwap(seq.request_id, list(move.block_table), move.num_tokens,
                                 move.slot_start, move.slot_length) for seq, move in ready]
        batch.swap_tier_path, batch.swap_tier_tokens = tier.handle.path, tier.handle.tokens


def _preemption(node: "Node", transition) -> str:
    """How a merge or split treats its running requests: `--flying-preemption`, or
    under auto the transition's own (soft when it names none)."""
    if node.config.flying.preemption != "auto":
        return node.config.flying.preemption
    return transition.preemption or "soft"


def _regroup(node: "Node", groups: tuple[int, ...], layout,
             preemption: str) -> tuple[int, int, int]:
    """The merged or split groups' replicas leave the layout. Their waiting requests
    move to the groups that replace them; their running ones stay where their KV was
    written and finish there in their old plan (the KV adaptor), interleaved with the
    new groups' steps (soft preemption) or paused while those have more urgent ones (hard);
    under `recompute` they move too and are computed again. A new group whose plan
    and ranks are those of replicas left behind takes them back. Returns (requests
    moved, requests computed again, requests kept in their old plan)."""
    leaving = [r for r in node.replicas if r.group in groups]
    recompute = preemption == "recompute"
    reprefilled = sum(r.scheduler.num_running for r in leaving) if recompute else 0
    seqs = []
    for replica in leaving:
        evicted = (replica.scheduler.evict_all() if recompute
                   else replica.scheduler.evict_waiting())
        for seq in evicted:
            replica.encoder.drop(seq.request_id)
            replica.num_structured -= seq.params.structured_outputs is not None
        seqs += evicted
        replica.leave(node.layout.plans[replica.group].name(), preemption == "hard")
    seqs.sort(key=Sequence.sort_key)
    arrivals = sorted(t for r in leaving for t in r.arrivals)
    for replica in node.replicas:
        if not replica.is_left_behind:
            replica.group = layout.group_of_rank(replica.ranks[0])
    node.layout = layout
    new = [_replica_for_group(node, g) for g in range(len(layout.plans))
           if not any(r.group == g for r in node.replicas)]
    node.replicas = sorted(node.replicas, key=lambda r: (r.is_left_behind, r.group or 0))
    node.drop_finished_left_behind()
    for k, replica in enumerate(new):
        replica.arrivals.extend(arrivals[k::len(new)])
        # what the ranks hold of the moved requests goes with the new groups' first step
        # (before any of them is sent there again)
        replica.encoder.finished += [seq.request_id for seq in seqs]
    for seq in seqs:
        target = min(new, key=lambda r: r.load)
        target.scheduler.add(seq)
        target.num_structured += seq.params.structured_outputs is not None
        node.replica_of[seq.request_id] = target
    kept = sum(r.scheduler.num_running for r in leaving if r.is_left_behind)
    return len(seqs), reprefilled, kept


def _replica_for_group(node: "Node", group: int) -> Replica:
    """The replica of a new group: the one left behind in its plan on its ranks (its
    requests resume without recompute), or a new one over its ranks' blocks."""
    plan = node.layout.plans[group]
    for replica in node.replicas:
        if replica.is_left_behind and replica.left_plan == plan.name():
            replica.rejoin(group)
            return replica
    size = min(node.executor.rank_blocks[r] for r in plan.ranks)
    replica = make_replica(node, group, size, 0)
    node.replicas.append(replica)
    return replica
