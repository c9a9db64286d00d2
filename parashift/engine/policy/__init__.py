"""Policies pick each step's plans from a view of the node; they never touch tensors
(protocol.py)."""
from parashift.engine.policy.protocol import Decision, GroupView, NodeView, Policy, Transition
from parashift.engine.policy.scripted import ScriptedPolicy
from parashift.engine.policy.shift import ShiftPolicy
from parashift.engine.policy.static import StaticPolicy

POLICIES = ("static", "shift")

__all__ = ["Decision", "GroupView", "NodeView", "Policy", "ScriptedPolicy", "ShiftPolicy",
           "StaticPolicy", "Transition", "make_policy"]


def make_policy(config) -> Policy:
    base = config.plan
    if config.parallel_policy == "static":
        return StaticPolicy(base)
    if config.parallel_policy == "shift":
        return ShiftPolicy(base, config.shift_threshold)
    raise ValueError(f"unknown parallel policy {config.parallel_policy!r}; choose from {POLICIES}")
