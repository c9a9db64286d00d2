"""Policies for tests: scripted transitions on top of fixed plans."""
from parashift.engine.policy import Decision, NodeView, Transition


class TransitionScript:
    """Every `every`-th decision asks for a transition of `group` to the next of `targets`
    (plan names, in turn); each group's steps run under the plan it last moved to."""
    name = "transition-script"

    def __init__(self, engine, group: int, targets: list[str], every: int, kind: str):
        self.plans = engine.policy_plans
        self.current = [plan.name() for plan in engine.layout.plans]
        self.group, self.targets, self.every, self.kind = group, targets, every, kind
        self.calls = self.asked = 0

    def decide(self, view: NodeView) -> Decision:
        self.calls += 1
        plans = tuple(self.current)
        if self.calls % self.every:
            return Decision(plans)
        target = self.targets[self.asked % len(self.targets)]
        self.asked += 1
        self.current[self.group] = target
        return Decision(plans, (Transition(self.kind, (self.group,), (target,)),))
