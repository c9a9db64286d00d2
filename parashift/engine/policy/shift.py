"""Shift Parallelism: the base (SP, TP) plan for large steps, full TP over the
SP_TP group for small ones (arXiv 2509.16495, Algorithm 3)."""
from typing import Callable

from parashift.parallel.plan import Plan


class ShiftPolicy:
    def __init__(self, base: Plan, threshold: int):
        if base.sp < 2:
            raise ValueError("the shift policy needs a base plan with sequence parallelism "
                             f"(sequence_parallel_size >= 2), got {base.name()}")
        if threshold < 0:
            raise ValueError(f"shift_threshold must be >= 0, got {threshold}")
        self.base, self.shift = base, base.shift_plan()
        self.plans = [self.base, self.shift]
        self.threshold = threshold
        self.force: Callable[[int], Plan] | None = None  # test hook: step tokens -> plan

    def choose(self, num_batched_tokens: int) -> Plan:
        if self.force is not None:
            return self.force(num_batched_tokens)
        return self.shift if num_batched_tokens <= self.threshold else self.base
