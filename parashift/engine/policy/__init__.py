"""Policies pick each step's plans from a view of the node; they never touch tensors
(protocol.py)."""
from parashift.designs import DESIGNS
from parashift.engine.policy.flying import FlyingPolicy
from parashift.engine.policy.protocol import Decision, GroupView, NodeView, Policy, Transition
from parashift.engine.policy.scripted import ScriptedPolicy
from parashift.engine.policy.seesaw import SeesawPolicy
from parashift.engine.policy.shift import ShiftPolicy
from parashift.engine.policy.sidp import SidpPolicy
from parashift.engine.policy.static import StaticPolicy
from parashift.parallel.layout import Layout

POLICIES = ("static", *DESIGNS)

__all__ = ["Decision", "FlyingPolicy", "GroupView", "NodeView", "Policy", "ScriptedPolicy",
           "SeesawPolicy", "ShiftPolicy", "SidpPolicy", "StaticPolicy", "Transition", "make_policy"]


def make_policy(config, layout: Layout, hf_config) -> Policy:
    """The configured policy over the node's starting layout (a design's: designs/)."""
    if config.parallel_policy == "static":
        return StaticPolicy(layout)
    design = DESIGNS.get(config.parallel_policy)
    if design is None:
        raise ValueError(f"unknown parallel policy {config.parallel_policy!r}; choose from "
                         f"{POLICIES}")
    return design.make_policy(config, layout, hf_config)
