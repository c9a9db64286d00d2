"""A policy whose choices come from a function of the group's view: for benchmarks
that time one plan at a time and tests that replay switch schedules. It offers only
plans the engine made at start-up (`LLMEngine.set_policy` checks)."""
from typing import Callable

from parashift.engine.policy.protocol import Decision, GroupView, NodeView
from parashift.parallel.plan import Plan


class ScriptedPolicy:
    name = "scripted"

    def __init__(self, plans: list[Plan], choose: Callable[[GroupView], Plan]):
        self.plans = list(plans)
        self.choose = choose

    def decide(self, view: NodeView) -> Decision:
        return Decision(tuple(self.choose(g).name() for g in view.groups))
