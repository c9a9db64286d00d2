"""Policies are pure functions of recorded views: no engine, no tensors."""
import pytest

from parashift.engine.policy import (GroupView, NodeView, ScriptedPolicy, ShiftPolicy,
                                     StaticPolicy)
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def group(next_step_tokens: int, plan: str = "", **counters) -> GroupView:
    values = dict(num_waiting=0, num_running=4, tokens_waiting=0, kv_blocks_used=10,
                  kv_blocks_free=90)
    return GroupView(plan, next_step_tokens=next_step_tokens, **{**values, **counters})


# Recorded from a 2-replica engine: a decode step, a prefill burst, an idle group.
RECORDED = NodeView((group(4, "sp2", num_running=4),
                     group(700, "sp2", num_waiting=3, tokens_waiting=2100),
                     group(0, "", num_running=0, kv_blocks_used=0, kv_blocks_free=100)), 12.5)


def test_static_keeps_each_groups_plan():
    policy = StaticPolicy(Layout.parse("tp2,single,single"))
    assert policy.decide(RECORDED).plans == ("tp2", "single@2", "single@3")


def test_shift_picks_tp_for_small_steps_and_the_base_for_large_ones():
    policy = ShiftPolicy(Layout.of(Plan(dp=3, sp=2)), threshold=256)
    decision = policy.decide(RECORDED)
    assert decision.plans == ("shift-tp2", "sp2@2-3", "shift-tp2@4-5")
    assert decision.transitions == ()


def test_shift_leaves_groups_without_sequence_parallelism_alone():
    policy = ShiftPolicy(Layout.parse("sp2,tp2,single"), threshold=256)
    assert policy.decide(RECORDED).plans == ("shift-tp2", "tp2@2-3", "single@4")
    assert [p.name() for p in policy.plans] == ["sp2", "tp2@2-3", "single@4", "shift-tp2"]


@pytest.mark.parametrize("tokens, expected", [(256, "shift-tp2"), (257, "sp2")])
def test_shift_threshold_is_inclusive(tokens, expected):
    view = NodeView((group(tokens),))
    assert ShiftPolicy(Layout.of(Plan(sp=2)), threshold=256).decide(view).plans == (expected,)


def test_shift_needs_sequence_parallelism_and_a_threshold():
    with pytest.raises(ValueError, match="sequence_parallel_size"):
        ShiftPolicy(Layout.of(Plan(tp=2)), 256)
    with pytest.raises(ValueError, match="shift_threshold"):
        ShiftPolicy(Layout.of(Plan(sp=2)), -1)


def test_scripted_policy_asks_its_function_per_group():
    plans = [Plan(sp=2), Plan(sp=2).shift_plan()]
    policy = ScriptedPolicy(plans, lambda g: plans[g.num_waiting > 0])
    assert policy.decide(RECORDED).plans == ("sp2", "shift-tp2", "sp2")
