"""Shift Parallelism: each group with sequence parallelism runs its base (SP, TP) plan
for large steps and full TP over its SP_TP ranks for small ones (arXiv 2509.16495,
Algorithm 3); groups without SP keep their plan."""
import logging

from parashift.cost.advisor import advisor_for
from parashift.engine.policy.protocol import Decision, NodeView
from parashift.parallel.layout import Layout

logger = logging.getLogger(__name__)


class ShiftPolicy:
    name = "shift"

    def __init__(self, layout: Layout, threshold: int):
        if all(plan.sp < 2 for plan in layout.plans):
            raise ValueError("the shift policy needs a base plan with sequence parallelism "
                             f"(sequence_parallel_size >= 2), got {layout.name()}")
        if threshold < 0:
            raise ValueError(f"shift_threshold must be >= 0, got {threshold}")
        self.bases = list(layout.plans)
        self.shifts = [plan.shift_plan() if plan.sp > 1 else plan for plan in self.bases]
        self.plans = self.bases + [s for s, b in zip(self.shifts, self.bases) if s is not b]
        self.threshold = threshold

    def decide(self, view: NodeView) -> Decision:
        return Decision(tuple(
            (shift if group.next_step_tokens <= self.threshold else base).name()
            for base, shift, group in zip(self.bases, self.shifts, view.groups)))


def policy_from_config(config, layout: Layout, hf_config) -> ShiftPolicy:
    """The threshold given, or with `cost_profile` the cost model's crossover: the largest
    step the shift plan runs no slower than the base plan (the smallest over the groups)."""
    advisor = advisor_for(config, hf_config, layout.world_size)
    if advisor is None:
        return ShiftPolicy(layout, config.shift.threshold)
    threshold = min(advisor.shift_threshold(plan) for plan in layout.plans if plan.sp > 1)
    logger.info("shift threshold %d tokens, from the cost model (%s)", threshold,
                advisor.model.compute.source)
    return ShiftPolicy(layout, threshold)
