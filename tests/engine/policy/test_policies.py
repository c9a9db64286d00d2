"""Policies are pure functions of recorded views: no engine, no tensors."""
import pytest

from parashift.engine.policy import (FlyingPolicy, GroupView, NodeView, ScriptedPolicy,
                                     ShiftPolicy, StaticPolicy, Transition)
from parashift.engine.policy.cost import SwitchCosts
from parashift.engine.policy.forced import ForcedWidth
from parashift.engine.policy.widths import layouts_by_width, transition_towards
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def group(next_step_tokens: int, plan: str = "", **counters) -> GroupView:
    values = dict(num_waiting=0, num_running=4, tokens_waiting=0, kv_blocks_used=10,
                  kv_blocks_free=90, longest_decode_left=64, step_s=0.02)
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
    assert decision.transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "recompute"),)
    queue = NodeView((group(40, num_running=2, num_waiting=3),), 11.0, ("merge4-tp4",))
    assert policy.decide(queue).transitions == (Transition("split", (0,), REPLICAS, "recompute"),)


def test_flying_merges_only_after_the_dwell_but_splits_for_a_queue_at_once():
    """A burst that reaches a group merged a moment ago splits it at once: every request
    the merged group admitted would run in it, between the replicas' steps, until it ends.
    A merge waits out the dwell after any change."""
    policy = flying(merge_running=4, dwell_s=2.0)
    light = NodeView(tuple(group(1, num_running=1) for _ in range(4)), 10.0, REPLICAS)
    assert policy.decide(light).transitions != ()
    burst = NodeView((group(40, num_running=1, num_waiting=6, tokens_waiting=6000),), 10.1,
                     ("merge4-tp4",))
    assert policy.decide(burst).transitions == (Transition("split", (0,), REPLICAS, "recompute"),)
    quiet = NodeView(tuple(group(1, num_running=1) for _ in range(4)), 11.0, REPLICAS)
    assert policy.decide(quiet).transitions == ()  # within the dwell of the split
    later = NodeView(quiet.groups, 12.2, REPLICAS)
    assert policy.decide(later).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "recompute"),)


def test_flying_keeps_a_merge_whose_moved_requests_wait_for_their_first_step():
    """A merge for light load moves the running requests (recompute): they wait in the
    merged group until its next step. That is no queue: the node stays merged (splitting
    for them, it merged and split again at every step and served nothing)."""
    policy = flying(merge_running=4, dwell_s=0.0)
    light = NodeView((group(1, num_running=1), group(1, num_running=1), group(0, num_running=0),
                      group(0, num_running=0)), 1.0, REPLICAS)
    assert policy.decide(light).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "recompute"),)
    moved = NodeView((group(0, num_running=0, num_waiting=2, tokens_waiting=64),), 1.1,
                     ("merge4-tp4",))
    assert policy.decide(moved).transitions == ()
    burst = NodeView((group(40, num_running=2, num_waiting=3, tokens_waiting=96),), 1.2,
                     ("merge4-tp4",))
    assert policy.decide(burst).transitions == (Transition("split", (0,), REPLICAS, "recompute"),)


def test_flying_holds_between_its_thresholds():
    policy = flying(merge_running=4, dwell_s=0.0)
    busy = NodeView(tuple(group(8, num_running=2) for _ in range(4)), 1.0, REPLICAS)
    assert policy.decide(busy).transitions == ()  # 8 running: too many to merge
    light = NodeView(tuple(group(1, num_running=1) for _ in range(4)), 1.5, REPLICAS)
    assert policy.decide(light).transitions != ()
    merged = NodeView((group(8, num_running=8),), 2.0, ("merge4-tp4",))
    assert policy.decide(merged).transitions == ()  # 8 running, none waiting: stays merged


def test_flying_merges_the_widest_aligned_group_and_leaves_the_rest():
    """3 replicas of a model with 8 heads: only ranks 0-1 can merge; rank 2 keeps serving."""
    policy = FlyingPolicy(Layout.of(Plan(dp=3)), num_heads=8, num_kv_heads=4, dwell_s=0.0)
    assert [p.name() for p in policy.merges] == ["merge2-tp2"]
    light = NodeView(tuple(group(1, num_running=1) for _ in range(3)), 1.0, REPLICAS[:3])
    assert policy.decide(light).transitions == (
        Transition("merge", (0, 1), ("merge2-tp2",), "recompute"),)
    queued = NodeView((group(9, num_waiting=2), group(1)), 2.0, ("merge2-tp2", "single@2"))
    assert policy.decide(queued).transitions == (
        Transition("split", (0,), REPLICAS[:2], "recompute"),)


THREE = REPLICAS[:3]
# Recorded from a 4-replica node whose replicas hold 2048 tokens of context each.
CONTEXT = ((1, 2048), (2, 4096), (4, 8192))


def test_flying_priority_request_binds_the_widest_group_at_once():
    """A queue would keep the replicas apart, and the dwell has not passed: a priority -1
    request still merges ranks 0-1 at once (hard preemption: their running requests pause,
    KV kept, while it is served), and replica 2 keeps serving."""
    policy = FlyingPolicy(Layout.of(Plan(dp=3)), num_heads=8, num_kv_heads=4, dwell_s=60.0)
    busy = NodeView((group(9, num_waiting=3, priorities=(-1, 0)), group(9, num_waiting=2),
                     group(9, num_waiting=2)), 1.0, THREE)
    assert policy.decide(busy).transitions == (
        Transition("merge", (0, 1), ("merge2-tp2",), "hard"),)
    bound = NodeView((group(9, num_waiting=5, priorities=(-1, 0)), group(9, num_waiting=2)),
                     2.0, ("merge2-tp2", "single@2"))
    assert policy.decide(bound).transitions == ()  # bound while the request runs
    done = NodeView((group(9, num_waiting=5), group(9, num_waiting=2)), 70.0,
                    ("merge2-tp2", "single@2"))
    assert policy.decide(done).transitions == (Transition("split", (0,), THREE[:2], "recompute"),)


def test_default_priority_requests_do_not_bind():
    policy = flying(dwell_s=60.0)
    queued = NodeView(tuple(group(9, num_waiting=2, priorities=(0, 3)) for _ in range(4)), 1.0,
                      REPLICAS)
    assert policy.decide(queued).transitions == ()


def test_flying_long_request_routes_wide():
    """A request of 3000 tokens that no replica holds: the node merges to width 2 (the
    narrowest that holds it) at once, both pairs in one transition, though a queue would keep
    it apart; it does not split below width 2 while the request is there, and goes back to
    width 1 after. (A node half-way there, another policy's doing, makes the pair left.)"""
    policy = flying(dwell_s=60.0)
    view = NodeView(tuple(group(9, num_waiting=2) for _ in range(4)), 1.0, REPLICAS,
                    CONTEXT, unplaced_need=3000)
    assert policy.decide(view).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge2-tp2", "merge2-tp2@2-3"), "recompute"),)
    half = NodeView(tuple(group(9, num_waiting=2) for _ in range(3)), 2.0,
                    ("merge2-tp2", "single@2", "single@3"), CONTEXT, unplaced_need=3000)
    assert policy.decide(half).transitions == (
        Transition("merge", (1, 2), ("merge2-tp2@2-3",), "recompute"),)
    placed = NodeView((group(9, num_waiting=4, longest_need=3000), group(9, num_waiting=4)),
                      100.0, ("merge2-tp2", "merge2-tp2@2-3"), CONTEXT)
    assert policy.decide(placed).transitions == ()  # a queue, but width 1 cannot hold it
    finished = NodeView((group(9, num_waiting=4, longest_need=500), group(9, num_waiting=4)),
                        101.0, ("merge2-tp2", "merge2-tp2@2-3"), CONTEXT)
    assert policy.decide(finished).transitions == (
        Transition("split", (0,), ("single", "single@1"), "recompute"),)


def test_flying_cost_check_refuses_an_unprofitable_merge():
    """Light load, but the running requests have 2 tokens left and 60,000 computed ones
    that a merge would compute again: no merge. With little to compute again and long
    generations left, the same load merges."""
    policy = flying(dwell_s=0.0, costs=SwitchCosts(prefill_tokens_per_s=8192.0))
    ending = NodeView(tuple(group(1, num_running=1, longest_decode_left=2,
                                  recompute_tokens=15_000) for _ in range(4)), 1.0, REPLICAS)
    assert policy.decide(ending).transitions == ()
    long_left = NodeView(tuple(group(1, num_running=1, longest_decode_left=500)
                               for _ in range(4)), 2.0, REPLICAS)
    assert policy.decide(long_left).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "recompute"),)


def test_flying_cost_check_refuses_an_unprofitable_split():
    """One short request waits on a merged group whose running requests a split computes
    again (--flying-preemption recompute): the split costs more than the queue's wait. Where
    the split keeps them (auto: soft), the same queue splits."""
    kept = flying(dwell_s=0.0)
    kept.width = 4
    small = NodeView((group(9, num_running=4, num_waiting=1, tokens_waiting=10,
                            recompute_tokens=40_000, longest_decode_left=8, step_s=0.02),),
                     1.0, ("merge4-tp4",))
    assert kept.decide(small).transitions == (Transition("split", (0,), REPLICAS, "soft"),)
    policy = flying(dwell_s=0.0, preemption="recompute")
    merged = ("merge4-tp4",)
    policy.width = 4  # as after a merge
    small_queue = NodeView((group(9, num_running=4, num_waiting=1, tokens_waiting=10,
                                  recompute_tokens=40_000),), 1.0, merged)
    assert policy.decide(small_queue).transitions == ()
    burst = NodeView((group(9, num_running=3, num_waiting=40, tokens_waiting=40_000,
                            recompute_tokens=40_000),), 2.0, merged)
    assert policy.decide(burst).transitions == (
        Transition("split", (0,), REPLICAS, "recompute"),)


def test_flying_split_keeps_running_requests_only_while_keeping_costs_less():
    """Kept, a merged group's running requests take a merged step on every rank between the
    replicas' steps until the longest ends (here 200 steps of 20 ms, 4 s); moved, their
    tokens are computed again by four replicas (8,192 tokens/s each)."""
    policy = flying(dwell_s=0.0)
    policy.width = 4

    def burst(recompute_tokens: int) -> NodeView:
        return NodeView((group(40, num_running=3, num_waiting=30, tokens_waiting=30_000,
                               longest_decode_left=200, recompute_tokens=recompute_tokens),),
                        1.0, ("merge4-tp4",))
    assert policy.decide(burst(6_000)).transitions == (
        Transition("split", (0,), REPLICAS, "recompute"),)  # 0.18 s computed again
    assert policy.decide(burst(200_000)).transitions == (
        Transition("split", (0,), REPLICAS, "soft"),)  # 6.1 s computed again
    costs = SwitchCosts()
    assert costs.keeping_pays(burst(131_072), 4) and not costs.keeping_pays(burst(131_071), 4)


def test_flying_merges_that_keep_running_requests_gain_nothing_from_them():
    """Under soft or hard preemption a merge leaves the running requests at their speed: with
    requests running it does not pay (its drain is a cost), while an idle node merges."""
    policy = flying(dwell_s=0.0, preemption="soft")
    light = NodeView(tuple(group(1, num_running=1, longest_decode_left=500)
                           for _ in range(4)), 1.0, REPLICAS)
    assert policy.decide(light).transitions == ()
    idle = NodeView(tuple(group(0, num_running=0) for _ in range(4)), 2.0, REPLICAS)
    assert policy.decide(idle).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "soft"),)


def test_switch_costs_follow_the_view():
    costs = SwitchCosts(prefill_tokens_per_s=1000.0, efficiency=0.5, step_s=0.1)
    idle = NodeView((group(0, num_running=0, step_s=0.0),))
    assert costs.cost(idle, 2) == 0.0 and costs.merge_pays(idle, 4)
    assert not costs.merge_pays(idle, 2)  # 2 x 0.5: no faster, so no merge even when idle
    busy = NodeView((group(0, num_running=2, recompute_tokens=3000, step_s=0.05),))
    assert costs.cost(busy, 2) == pytest.approx(0.05 + 1.5)
    assert costs.merge_gain(busy, 4) == pytest.approx(64 * 0.05 * 0.5)
    # a measured prompt rate replaces the default: the slowest group's
    measured = NodeView((group(0, num_running=2, recompute_tokens=3000, step_s=0.05,
                               prefill_tokens_per_s=6000.0),
                         group(0, prefill_tokens_per_s=0.0)))
    assert costs.prefill_rate(measured) == 6000.0
    assert costs.cost(measured, 2) == pytest.approx(0.05 + 0.25)
    assert costs.prefill_rate(NodeView((group(0, prefill_tokens_per_s=6000.0),
                                        group(0, prefill_tokens_per_s=2000.0)))) == 2000.0
    with pytest.raises(ValueError, match="efficiency"):
        SwitchCosts(efficiency=0.0)


def test_a_merge_reads_the_measured_speedup_of_the_merged_plan():
    """Once the merged plan and the replicas have each run a decode step, the merge's gain
    uses their measured steps' ratio instead of factor x efficiency; a merged plan measured
    no faster than the replicas is not merged into, not even when the node is idle."""
    costs = SwitchCosts(efficiency=0.8)
    light = (group(1, num_running=1, longest_decode_left=500, step_s=0.005),) * 4

    def view(measured, groups=light):
        return NodeView(groups, 1.0, REPLICAS, decode_step_s=tuple(measured.items()))
    unmeasured = view({"single": 0.005})
    assert costs.speedup(unmeasured, 4, ("merge4-tp4",)) == pytest.approx(3.2)
    faster = view({"single": 0.005, "single@2": 0.006, "merge4-tp4": 0.002})
    assert costs.speedup(faster, 4, ("merge4-tp4",)) == pytest.approx(3.0)  # the slowest: 6 ms
    assert costs.merge_gain(faster, 4, merged=("merge4-tp4",)) == pytest.approx(
        500 * 0.005 * (1 - 1 / 3))
    slower = view({"single": 0.005, "merge4-tp4": 0.0055})
    assert not costs.merge_pays(slower, 4, merged=("merge4-tp4",))
    idle = view({"single": 0.005, "merge4-tp4": 0.0055},
                tuple(group(0, num_running=0) for _ in range(4)))
    assert not costs.merge_pays(idle, 4, merged=("merge4-tp4",))
    policy = flying(dwell_s=0.0)
    assert policy.decide(slower).transitions == ()
    assert policy.decide(faster).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "recompute"),)


def test_a_priority_request_does_not_bind_a_group_measured_slower():
    policy = flying(dwell_s=600.0)
    urgent = (group(1, num_running=2, priorities=(-1, 0)),) + (group(1, num_running=1),) * 3
    slower = NodeView(urgent, 1.0, REPLICAS,
                      decode_step_s=(("merge4-tp4", 0.006), ("single", 0.005)))
    assert policy.decide(slower).transitions == ()
    faster = NodeView(urgent, 1.0, REPLICAS,
                      decode_step_s=(("merge4-tp4", 0.003), ("single", 0.005)))
    assert policy.decide(faster).transitions == (
        Transition("merge", (0, 1, 2, 3), ("merge4-tp4",), "hard"),)


def test_layouts_by_width_and_the_transitions_between_them():
    replicas = list(Layout.of(Plan(dp=4)).plans)
    made = {p.name() for p in flying().plans}
    layouts = layouts_by_width(replicas, made)
    assert layouts == {1: REPLICAS, 2: ("merge2-tp2", "merge2-tp2@2-3"), 4: ("merge4-tp4",)}
    assert layouts_by_width(replicas, set(REPLICAS)) == {1: REPLICAS}
    assert transition_towards(REPLICAS, REPLICAS) is None
    assert transition_towards(layouts[2], layouts[4]) == Transition(
        "merge", (0, 1), ("merge4-tp4",))
    assert transition_towards(layouts[4], layouts[2]) == Transition(
        "split", (0,), ("merge2-tp2", "merge2-tp2@2-3"))
    assert transition_towards(REPLICAS, layouts[2], at_once=True) == Transition(
        "merge", (0, 1, 2, 3), ("merge2-tp2", "merge2-tp2@2-3"))
    assert transition_towards(REPLICAS, layouts[2]) == Transition(
        "merge", (0, 1), ("merge2-tp2",))
    # groups that no target group contains and whose parts do not cover it: into replicas
    three = ("merge3-tp3", "single@3")
    assert transition_towards(layouts[2], three) == Transition(
        "split", (1,), ("single@2", "single@3"))


def test_forced_width_moves_the_node_and_hands_back():
    inner = flying(dwell_s=0.0)
    forced = ForcedWidth(inner, layouts_by_width(inner.replicas, {p.name() for p in inner.plans}))
    busy = NodeView(tuple(group(9, num_waiting=3) for _ in range(4)), 1.0, REPLICAS)
    assert forced.decide(busy).transitions == ()  # the policy: a queue, stay apart
    forced.force(2)
    assert forced.decide(busy).transitions == (Transition("merge", (0, 1), ("merge2-tp2",)),)
    half = NodeView(tuple(group(9, num_waiting=3) for _ in range(3)), 2.0,
                    ("merge2-tp2", "single@2", "single@3"))
    assert forced.decide(half).transitions == (Transition("merge", (1, 2), ("merge2-tp2@2-3",)),)
    there = NodeView((group(9, num_waiting=3), group(9, num_waiting=3)), 3.0,
                     ("merge2-tp2", "merge2-tp2@2-3"))
    assert forced.decide(there).plans == there.layout
    assert forced.decide(there).transitions == ()  # held, though the policy would split
    forced.force(None)
    assert forced.decide(there).transitions == (
        Transition("split", (0,), ("single", "single@1"), "recompute"),)
    with pytest.raises(ValueError, match=r"widths: \[1, 2, 4\]"):
        forced.force(3)


def test_forced_width_keeps_the_policys_plans():
    shift = ShiftPolicy(Layout.of(Plan(sp=2)), threshold=256)
    forced = ForcedWidth(shift, {1: ("sp2",)})
    forced.force(1)
    view = NodeView((group(4),), 1.0, ("sp2",))
    assert forced.decide(view).plans == ("shift-tp2",)
