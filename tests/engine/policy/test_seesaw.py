"""The seesaw policy on recorded views: prefill until the CPU KV tier cannot hold the next
prompt (or none waits), decode until the tier is empty, never more transitions than that;
a prefill phase bounded in time for online serving."""
import pytest

from parashift.engine.policy.protocol import GroupView, NodeView
from parashift.engine.policy.seesaw import SeesawPolicy, seesaw_plans
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def tier(fill: float, waiting: int = 0, prompt: int = 0, free_run: int = 0, running: int = 0,
         t: float = 0.0, groups: int = 1, prompt_left: int = 0) -> NodeView:
    g = GroupView("", num_waiting=waiting, num_running=running, tokens_waiting=waiting * prompt,
                  next_step_tokens=0, kv_blocks_used=0, kv_blocks_free=100, cpu_tier_fill=fill,
                  cpu_tier_free_run=free_run, next_prompt_tokens=prompt,
                  prompt_tokens_left=prompt_left)
    return NodeView((g,) * groups, t)


def test_prefill_fills_the_tier_then_decode_drains_it():
    policy = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    assert [p.name() for p in policy.plans] == ["pp2", "tp2"]
    # prompts that fit keep the prefill plan, however full the tier gets
    for fill, free in ((0.0, 1000), (0.5, 500), (0.9, 100)):
        decision = policy.decide(tier(fill, waiting=5, prompt=100, free_run=free))
        assert decision.plans == ("pp2",) and decision.transitions == ()
    full = policy.decide(tier(0.95, waiting=5, prompt=100, free_run=50))
    assert full.plans == ("tp2",) and [(t.kind, t.target) for t in full.transitions] == [
        ("reshard", ("tp2",))]
    # decode while the tier holds KV, prompts waiting or not
    for fill in (0.95, 0.4, 0.01):
        assert policy.decide(tier(fill, waiting=5, prompt=100, free_run=50)).transitions == ()
    back = policy.decide(tier(0.0, waiting=5, prompt=100, free_run=1000, running=3))
    assert back.plans == ("pp2",) and back.transitions[0].target == ("pp2",)


def test_no_prompt_left_ends_prefill_and_decode_runs_to_the_end():
    policy = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    assert policy.decide(tier(0.3, waiting=0)).plans == ("tp2",)
    for _ in range(3):  # an empty tier and no prompt: stay in decode
        assert policy.decide(tier(0.0, waiting=0, running=2)).transitions == ()


def test_admitted_prompts_finish_their_prefill_under_the_prefill_plan():
    policy = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    # the tier is full (or no prompt waits) but running prompts have chunks left: prefill on
    for waiting, free in ((5, 50), (0, 300)):
        decision = policy.decide(tier(0.9, waiting=waiting, prompt=100, free_run=free,
                                      running=3, prompt_left=64))
        assert decision.plans == ("pp2",) and decision.transitions == ()
    # a stalled phase (no room: free run 0) switches with prompts unfinished
    stalled = policy.decide(tier(0.9, waiting=5, prompt=100, free_run=0, running=3,
                                 prompt_left=64))
    assert stalled.plans == ("tp2",)
    bounded = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2", max_prefill_ms=100)
    bounded.decide(tier(0.5, waiting=5, prompt=100, free_run=50, running=3, prompt_left=64))
    timed_out = bounded.decide(tier(0.5, waiting=5, prompt=100, free_run=50, running=3,
                                    prompt_left=64, t=0.2))
    assert timed_out.plans == ("tp2",)
    fresh = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    done = fresh.decide(tier(0.9, waiting=5, prompt=100, free_run=50, running=3))
    assert done.plans == ("tp2",) and done.transitions[0].target == ("tp2",)


def test_an_idle_group_does_not_switch():
    policy = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    for _ in range(3):
        assert policy.decide(tier(0.0)).transitions == ()


def test_max_prefill_ms_bounds_a_prefill_phase_when_there_is_something_to_decode():
    policy = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2", max_prefill_ms=200)
    assert policy.decide(tier(0.1, waiting=9, prompt=10, free_run=900, t=10.0)).transitions == ()
    assert policy.decide(tier(0.2, waiting=9, prompt=10, free_run=800, t=10.1)).transitions == ()
    assert policy.decide(tier(0.3, waiting=9, prompt=10, free_run=700, t=10.25)).plans == ("tp2",)
    unbounded = SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2")
    for t in (10.0, 50.0, 100.0):
        assert unbounded.decide(tier(0.3, waiting=9, prompt=10, free_run=700, t=t)).transitions == ()


def test_each_group_switches_on_its_own_counters():
    layout = Layout.parse("pp2,pp2")
    policy = SeesawPolicy(layout, "pp2", "tp2")
    a = GroupView("", 0, 0, 0, 0, 0, 100, cpu_tier_fill=0.5)  # no prompt left: decode
    b = GroupView("", 4, 0, 400, 0, 0, 100, cpu_tier_fill=0.5, cpu_tier_free_run=500,
                  next_prompt_tokens=100)
    decision = policy.decide(NodeView((a, b)))
    assert decision.plans == ("tp2", "pp2@2-3")
    assert [(t.groups, t.target) for t in decision.transitions] == [((0,), ("tp2",))]


@pytest.mark.parametrize("prefill,decode,match", [
    ("pp2", "tp4", "same world size"), ("pp2", "pp2", "use the static policy"),
    ("dp2", "tp2", "no dp or sp"), ("sp2", "tp2", "no dp or sp")])
def test_plan_pairs_seesaw_cannot_switch_are_refused(prefill, decode, match):
    with pytest.raises(ValueError, match=match):
        seesaw_plans(prefill, decode, (0, 1))


def test_the_layout_starts_in_the_prefill_plan():
    with pytest.raises(ValueError, match="starts each group in its prefill plan"):
        SeesawPolicy(Layout.of(Plan(tp=2)), "pp2", "tp2")
    with pytest.raises(ValueError, match="max_prefill_ms must be >= 0"):
        SeesawPolicy(Layout.of(Plan(pp=2)), "pp2", "tp2", max_prefill_ms=-1)
    policy = SeesawPolicy(Layout.of(Plan(pp=2, tp=2)), "pp2xtp2", "tp4")
    assert [p.name() for p in policy.plans] == ["pp2xtp2", "tp4"]
