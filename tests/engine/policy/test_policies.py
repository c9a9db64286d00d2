"""Policies are pure functions of recorded views: no engine, no tensors."""
import pytest

from parashift.engine.policy import (FlyingPolicy, GroupView, NodeView, ScriptedPolicy,
                                     ShiftPolicy, StaticPolicy, Transition)
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


def flying(**options) -> FlyingPolicy:
    return FlyingPolicy(Layout.of(Plan(dp=4)), num_heads=8, num_kv_heads=4, **options)


REPLICAS = ("single", "single@1", "single@2", "single@3")


def test_flying_offers_every_aligned_merge_the_heads_allow():
    policy = flying()
    assert [p.name() for p in policy.merges] == [
        "merge2-tp2", "merge2-tp2@2-3", "merge4-tp4"]  # no width 3: 4 replicas
    with pytest.raises(ValueError, match="two or more data-parallel replicas"):
        FlyingPolicy(Layout.parse("tp2,single"), 8, 4)


def test_flying_merges_under_light_load_and_splits_when_a_queue_builds():
    policy = flying(merge_running=4, dwell_s=2.0)
    light = NodeView(tuple(group(1, num_running=1) for _ in range(4)), 10.0, REPLICAS)
    decision = policy.decide(light)
    assert decision.plans == REPLICAS
    assert decision.transitions == (Transition("merge", (0, 1, 2, 3), ("merge4-tp4",)),)
    queue = NodeView((group(40, num_running=2, num_waiting=3),), 11.0, ("merge4-tp4",))
    assert policy.decide(queue).transitions == ()  # within the dwell
    later = NodeView(queue.groups, 12.5, ("merge4-tp4",))
    assert policy.decide(later).transitions == (Transition("split", (0,), REPLICAS),)


def test_flying_holds_between_its_thresholds():
    policy = flying(merge_running=4, dwell_s=0.0)
    busy = NodeView(tuple(group(8, num_running=2) for _ in range(4)), 1.0, REPLICAS)
    assert policy.decide(busy).transitions == ()  # 8 running: too many to merge
    merged = NodeView((group(8, num_running=8),), 2.0, ("merge4-tp4",))
    assert policy.decide(merged).transitions == ()  # 8 running, none waiting: stays merged


def test_flying_merges_the_widest_aligned_group_and_leaves_the_rest():
    """3 replicas of a model with 8 heads: only ranks 0-1 can merge; rank 2 keeps serving."""
    policy = FlyingPolicy(Layout.of(Plan(dp=3)), num_heads=8, num_kv_heads=4, dwell_s=0.0)
    assert [p.name() for p in policy.merges] == ["merge2-tp2"]
    light = NodeView(tuple(group(1, num_running=1) for _ in range(3)), 1.0, REPLICAS[:3])
    assert policy.decide(light).transitions == (Transition("merge", (0, 1), ("merge2-tp2",)),)
    queued = NodeView((group(9, num_waiting=2), group(1)), 2.0, ("merge2-tp2", "single@2"))
    assert policy.decide(queued).transitions == (Transition("split", (0,), REPLICAS[:2]),)
