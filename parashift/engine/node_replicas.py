"""The node's replicas over its ranks' KV pools (`Node.start`, and the new groups a merge or
split makes): the blocks each one reads, its scheduler, its Seesaw gate and swap tier."""
import dataclasses
from typing import TYPE_CHECKING

from parashift.engine.replica import Replica
from parashift.engine.swap import SwapSpace, swap_tokens
from parashift.kv.block_manager import BlockManager
from parashift.kv.views import tokens_per_block

if TYPE_CHECKING:
    from parashift.engine.node import Node


def replica_pools(node: "Node", groups=None) -> list[tuple[int, int, int]]:
    """(group, first block id, number of blocks) of each replica of `groups` (all):
    a group serves one, or, with pipeline parallelism, one per stage when each part of
    its ranks' pool still fits a whole sequence (while stage 1 runs one replica's step,
    stage 0 runs the next one's)."""
    replicas = []
    for group, plan in enumerate(node.layout.plans):
        if groups is not None and group not in groups:
            continue
        blocks = min(node.executor.rank_blocks[r] for r in plan.ranks)
        fits = (blocks // plan.pp) * node.config.block_size >= node.max_model_len
        parts = plan.pp if fits and not node.seesaw else 1  # seesaw: its plans change PP
        replicas += [(group, k * (blocks // parts), blocks // parts) for k in range(parts)]
    return replicas


def make_replica(node: "Node", group: int, num_blocks: int, block_offset: int) -> Replica:
    """A replica of `group` over its ranks' pool, in the blocks its plan reads; it
    shares the blocks of its ranks with the replicas that hold requests there."""
    plan = node.layout.plans[group]
    block_size = tokens_per_block(plan, node.loaded[plan.ranks[0]], node.kv_heads,
                                  node.config.block_size)
    tier = node.seesaw.get(tuple(sorted(plan.ranks)))
    # (under seesaw a cached block may hold the other plan's layout: no prefix caching)
    blocks = BlockManager(num_blocks, block_size,
                          node.config.enable_prefix_caching and tier is None,
                          plan.ranks, block_offset)
    blocks.share([r.block_manager for r in node.replicas])
    holds = min(node.max_model_len, num_blocks * block_size)  # the layout's others may hold more
    config = dataclasses.replace(node.scheduler_config, max_model_len=holds)
    replica = Replica(blocks, config, node.eos_ids, block_offset, group, plan.ranks)
    replica.scheduler.gate = tier.gate if tier is not None else None
    if node.config.preemption_mode == "swap":
        replica.swap_space = _swap_space(node, plan.ranks)
        replica.scheduler.swap_slots = replica.swap_space.slots
    return replica


def _swap_space(node: "Node", ranks: tuple[int, ...]) -> SwapSpace:
    """The CPU tier of the group on `ranks` (made with its first replica: at start-up for
    the layout's groups), which its replicas share."""
    key = tuple(sorted(ranks))
    space = node.swap_spaces.get(key)
    if space is None:
        tokens = swap_tokens(node.config.swap_space, node.tier_shape)
        space = node.swap_spaces[key] = SwapSpace(node.tier_shape, tokens)
    return space
