"""One plan for every step."""
from parashift.engine.policy.protocol import Decision, NodeView, same_plan_for_all
from parashift.parallel.plan import Plan


class StaticPolicy:
    name = "static"

    def __init__(self, plan: Plan):
        self.plans = [plan]

    def decide(self, view: NodeView) -> Decision:
        return same_plan_for_all(view, self.plans[0])
