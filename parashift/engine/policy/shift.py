"""Shift Parallelism: the base (SP, TP) plan for large steps, full TP over the
SP_TP group for small ones (arXiv 2509.16495, Algorithm 3)."""
from parashift.engine.policy.protocol import Decision, NodeView
from parashift.parallel.plan import Plan


class ShiftPolicy:
    name = "shift"

    def __init__(self, base: Plan, threshold: int):
        if base.sp < 2:
            raise ValueError("the shift policy needs a base plan with sequence parallelism "
                             f"(sequence_parallel_size >= 2), got {base.name()}")
        if threshold < 0:
            raise ValueError(f"shift_threshold must be >= 0, got {threshold}")
        self.base, self.shift = base, base.shift_plan()
        self.plans = [self.base, self.shift]
        self.threshold = threshold

    def decide(self, view: NodeView) -> Decision:
        return Decision(tuple(
            (self.shift if g.next_step_tokens <= self.threshold else self.base).name()
            for g in view.groups))
