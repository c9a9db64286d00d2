"""Each group keeps its plan for every step."""
from parashift.engine.policy.protocol import Decision, NodeView
from parashift.parallel.layout import Layout


class StaticPolicy:
    name = "static"
    reads_view = False  # each group keeps its plan whatever it holds

    def __init__(self, layout: Layout):
        self.plans = list(layout.plans)

    def decide(self, view: NodeView) -> Decision:
        return Decision(tuple(plan.name() for plan in self.plans))
