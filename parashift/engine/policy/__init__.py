"""Policies pick each step's plans from a view of the node; they never touch tensors
(protocol.py)."""
from parashift.engine.policy.flying import FlyingPolicy
from parashift.engine.policy.protocol import Decision, GroupView, NodeView, Policy, Transition
from parashift.engine.policy.scripted import ScriptedPolicy
from parashift.engine.policy.seesaw import SeesawPolicy
from parashift.engine.policy.shift import ShiftPolicy
from parashift.engine.policy.sidp import SidpPolicy, probed_threshold
from parashift.engine.policy.static import StaticPolicy
from parashift.parallel.layout import Layout

POLICIES = ("static", "shift", "flying", "seesaw", "sidp")

__all__ = ["Decision", "FlyingPolicy", "GroupView", "NodeView", "Policy", "ScriptedPolicy",
           "SeesawPolicy", "ShiftPolicy", "SidpPolicy", "StaticPolicy", "Transition", "make_policy"]


def make_policy(config, layout: Layout, hf_config) -> Policy:
    """The configured policy over the node's starting layout."""
    if config.parallel_policy == "static":
        return StaticPolicy(layout)
    if config.parallel_policy == "shift":
        return ShiftPolicy(layout, config.shift_threshold)
    if config.parallel_policy == "flying":
        return FlyingPolicy(layout, hf_config.num_attention_heads, hf_config.num_key_value_heads,
                            config.flying_merge_running, config.flying_dwell_s,
                            preemption=config.flying_preemption,
                            topology=getattr(config, "topology", None))
    if config.parallel_policy == "seesaw":
        return SeesawPolicy(layout, config.prefill_plan, config.decode_plan,
                            config.seesaw_max_prefill_ms)
    if config.parallel_policy == "sidp":
        threshold = config.sidp_batch_threshold
        if config.sidp_probe_file is not None:
            threshold = probed_threshold(config.sidp_probe_file, config.model or "",
                                         layout.plans[0].ffn_replicas, layout.plans[0].tp)
        return SidpPolicy(layout, threshold, config.sidp_min_dwell_steps)
    raise ValueError(f"unknown parallel policy {config.parallel_policy!r}; choose from {POLICIES}")
