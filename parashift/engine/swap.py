"""Swap preemption on the engine's side (--preemption-mode swap): each group's CPU KV tier
of --swap-space GiB (its buffer, created here and mapped by the group's ranks when a step
names it, and its slots, which the group's schedulers take and free), and the counts of
what preemptions moved or dropped."""
import logging
from dataclasses import dataclass

from parashift.engine.scheduler import SchedulerOutput
from parashift.kv.cpu_tier import CpuKVTier, TierShape
from parashift.kv.tier_allocator import TierAllocator

logger = logging.getLogger(__name__)


def swap_tokens(swap_space_gib: float, shape: TierShape) -> int:
    tokens = int(swap_space_gib * 2**30 // shape.token_bytes)
    if tokens < 1:
        raise ValueError(f"swap_space = {swap_space_gib} GiB holds no token ({shape.token_bytes} "
                         "bytes each)")
    return tokens


class SwapSpace:
    """One group's tier: where its preempted requests' KV waits."""

    def __init__(self, shape: TierShape, tokens: int):
        self.buffer = CpuKVTier.create(shape, tokens, advice="; lower --swap-space")
        self.slots = TierAllocator(tokens)

    @property
    def path(self) -> str:
        return self.buffer.path

    @property
    def tokens(self) -> int:
        return self.buffer.tokens

    def close(self) -> None:
        self.buffer.close()


@dataclass
class PreemptionCounts:
    """Since start-up: preemptions, swaps each way (requests and KV bytes of the whole
    model), and computed tokens that preemptions by recompute dropped."""
    preemptions: int = 0
    swapped_out: int = 0
    swapped_in: int = 0
    swap_bytes_out: int = 0
    swap_bytes_in: int = 0
    recompute_tokens: int = 0

    def add(self, sched: SchedulerOutput, token_bytes: int) -> None:
        self.preemptions += len(sched.preempted)
        self.recompute_tokens += sched.recompute_tokens
        if not sched.swap_out and not sched.swap_in:
            return
        bytes_out = token_bytes * sum(op.num_tokens for op in sched.swap_out)
        bytes_in = token_bytes * sum(op.num_tokens for op in sched.swap_in)
        self.swapped_out += len(sched.swap_out)
        self.swapped_in += len(sched.swap_in)
        self.swap_bytes_out += bytes_out
        self.swap_bytes_in += bytes_in
        logger.info("KV swap: %d request(s) out (%.2f MiB), %d in (%.2f MiB)",
                    len(sched.swap_out), bytes_out / 2**20, len(sched.swap_in), bytes_in / 2**20)
