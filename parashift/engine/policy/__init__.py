"""Policies pick each step's plan from what the scheduler sees; they never touch tensors."""
from parashift.engine.policy.shift import ShiftPolicy
from parashift.engine.policy.static import StaticPolicy

POLICIES = ("static", "shift")


def make_policy(config):
    base = config.plan
    if config.parallel_policy == "static":
        return StaticPolicy(base)
    if config.parallel_policy == "shift":
        return ShiftPolicy(base, config.shift_threshold)
    raise ValueError(f"unknown parallel policy {config.parallel_policy!r}; choose from {POLICIES}")
