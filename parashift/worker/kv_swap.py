"""Swap preemption on one rank: a step's swaps, done at the start of its launch (before
its forward), outs before ins. A swap out gathers a preempted request's KV of this rank's
slice (its stage's layers x its KV heads, as the step's plan reads the pool) from the
pages the engine is about to reuse into the request's slot of its group's CPU tier; a
swap in scatters a resumed request's KV from its slot into its new pages. Steps run in
order on every rank, so a swap out sees every earlier step's KV writes and precedes this
step's writes into the freed pages."""
import torch

from parashift.kv.cpu_tier import TierMappings, TierShape
from parashift.kv.tier_allocator import TierSlot
from parashift.kv.tier_copy import gather, rank_kv_slice, scatter, wait_for_copies
from parashift.kv.views import view_pool
from parashift.step.message import StepBatch
from parashift.worker.plan_resources import PlanResources


class KVSwapper:
    def __init__(self, shape: TierShape, device: torch.device):
        self.shape = shape
        self.tiers = TierMappings(device)
        self.bytes_out = self.bytes_in = 0  # this rank's slices moved, since start-up

    def run(self, batch: StepBatch, plan: PlanResources, pool_k: torch.Tensor,
            pool_v: torch.Tensor) -> None:
        """The step's swaps on this rank's pool (`pool_k`, `pool_v`: as it was allocated)."""
        if not batch.swap_out and not batch.swap_in:
            return
        tier = self.tiers.get(batch.swap_tier_path, self.shape, batch.swap_tier_tokens)
        kv_slice = rank_kv_slice(plan.plan, plan.state.rank, self.shape.num_layers,
                                 self.shape.num_kv_heads)
        k, v = (view_pool(pool, plan.block_size) for pool in (pool_k, pool_v))
        for swap in batch.swap_out:
            self.bytes_out += gather(k, v, swap.block_ids, swap.num_tokens, kv_slice, tier,
                                     TierSlot(swap.slot_start, swap.slot_length))
        for swap in batch.swap_in:
            self.bytes_in += scatter(tier, TierSlot(swap.slot_start, swap.slot_length),
                                     swap.num_tokens, kv_slice, k, v, swap.block_ids)
        wait_for_copies(pool_k.device)  # the engine reuses the slots swapped in

    def close(self) -> None:
        self.tiers.close()
