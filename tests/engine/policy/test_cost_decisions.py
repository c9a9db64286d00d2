"""Each policy's decisions on recorded views with the cost model (`cost_profile`) of the
committed H200 profiles: Shift's threshold is the model's crossover, SiDP's B_th its fetch
against the step, Flying's unmeasured gain its predicted speedup, Seesaw's `auto` its rates.
The values are pinned: a change to the model or the profiles shows here."""
import json
from types import SimpleNamespace

import pytest

from parashift.cost.advisor import advisor_for, load_profiles
from parashift.cost.shape import SHAPES
from parashift.cost.sidp import sidp_step
from parashift.cost.step import StepBatch
from parashift.engine.policy import shift, sidp
from parashift.engine.policy.cost import SwitchCosts
from parashift.engine.policy.flying import FlyingPolicy
from parashift.engine.policy.protocol import GroupView, NodeView
from parashift.engine.policy.seesaw_cost import Hardware, ModelShape, Workload, choose_plans
from parashift.engine.policy.sidp import SidpPolicy
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan

PROFILE = str(SHAPES.parent / "results" / "profiles" / "h200_compute.json")
LLAMA_8B = SimpleNamespace(**json.loads((SHAPES / "llama-3.1-8b.json").read_text()))
REPLICAS = ("single", "single@1", "single@2", "single@3")


def config(**options) -> SimpleNamespace:
    return SimpleNamespace(cost_profile=PROFILE, max_num_seqs=256, **options)


def group(tokens: int, plan: str = "single", **counters) -> GroupView:
    values = dict(num_waiting=0, num_running=1, tokens_waiting=0, kv_blocks_used=10,
                  kv_blocks_free=90, longest_decode_left=500)
    return GroupView(plan, next_step_tokens=tokens, **{**values, **counters})


@pytest.mark.parametrize("base,threshold", [(Plan(sp=2), 2508), (Plan(sp=4), 3957),
                                            (Plan(sp=2, tp=2), 4206)])
def test_shift_runs_each_step_under_the_plan_the_model_predicts_faster(base, threshold):
    options = config(shift=SimpleNamespace(threshold=256))
    policy = shift.policy_from_config(options, Layout.of(base), LLAMA_8B)
    assert policy.threshold == threshold
    shift_name, base_name = base.shift_plan().name(), base.name()
    assert policy.decide(NodeView((group(threshold),))).plans == (shift_name,)
    assert policy.decide(NodeView((group(threshold + 1),))).plans == (base_name,)


def test_without_a_cost_profile_shift_keeps_its_given_threshold():
    options = SimpleNamespace(cost_profile=None, shift=SimpleNamespace(threshold=256))
    assert shift.policy_from_config(options, Layout.of(Plan(sp=2)), LLAMA_8B).threshold == 256


def test_sidp_takes_b_th_from_the_link_profiles_peer_rate():
    layout = Layout.of(Plan(dp=2))
    shared = Layout(tuple(p.sharing_ffn("cas", (0, 1)) for p in layout.plans))
    options = config(sidp=SimpleNamespace(batch_threshold=600, probe_file=None,
                                          min_dwell_steps=1), model="llama-3.1-8b")
    policy = sidp.policy_from_config(options, shared, LLAMA_8B)
    # where WaS's predicted step (the fetch at 224 GB/s between two H200s, the x2 link
    # profile, less the compute hiding it) is no slower than CaS's, whose decodes replay
    # graphs by default (eagerly, --no-cuda-graphs: 113)
    assert policy.threshold == 390
    assert isinstance(policy, SidpPolicy)
    view = NodeView((group(400), group(400)))
    assert policy.decide(view).plans[0].endswith("+was/0-1")  # 400 > 390
    assert policy.decide(NodeView((group(160), group(160)))).plans[0].endswith("+cas/0-1")
    eager = sidp.policy_from_config(config(sidp=options.sidp, model="llama-3.1-8b",
                                           cuda_graphs=False), shared, LLAMA_8B)
    assert eager.threshold == 113
    assert eager.decide(NodeView((group(160), group(160)))).plans[0].endswith("+was/0-1")


def test_with_the_cost_model_sidp_takes_the_faster_mode_each_round():
    """No hysteresis, no dwell (a switch moves no weight): 410 tokens a replica (past 390,
    inside the hand-set 20% band) runs WaS at once, and the next round's 300 CaS, though the
    dwell given is 8 rounds."""
    layout = Layout.of(Plan(dp=2))
    shared = Layout(tuple(p.sharing_ffn("cas", (0, 1)) for p in layout.plans))
    options = config(sidp=SimpleNamespace(batch_threshold=600, probe_file=None,
                                          min_dwell_steps=8), model="llama-3.1-8b")
    policy = sidp.policy_from_config(options, shared, LLAMA_8B)
    assert (policy.threshold, policy.hysteresis, policy.dwell) == (390, 0.0, 1)
    assert policy.decide(NodeView((group(410), group(410)))).plans[0].endswith("+was/0-1")
    assert policy.decide(NodeView((group(300), group(300)))).plans[0].endswith("+cas/0-1")
    assert policy.switches == 2
    by_hand = SimpleNamespace(cost_profile=None, max_num_seqs=256, sidp=options.sidp, model="x")
    hand_set = sidp.policy_from_config(by_hand, shared, LLAMA_8B)
    assert (hand_set.threshold, hand_set.hysteresis, hand_set.dwell) == (600, 0.2, 8)


def test_sidp_crossover_is_where_the_was_step_stops_being_slower_than_the_cas_step():
    """The fetch hides under a 1466-sequence decode step at d = 2 (the paper's B_th), but
    WaS's steps run eagerly (its fetches are not captured) while CaS's decodes replay graphs
    (the default): CaS stays faster for every decode batch the 256 seats allow, and WaS is
    no slower from a prompt chunk of 390 tokens. With --no-cuda-graphs an eager CaS layer
    launches its exchanges from every peer's host (cas_kernels_per_peer): WaS from 113
    decodes a replica. 4666 at d = 4 either way."""
    advisor = advisor_for(config(), LLAMA_8B, 2)
    plan, crossover = Plan(), advisor.sidp_crossover(1, 2)
    assert crossover == 390

    def steps(model, batch):
        return [sidp_step(model, plan, batch, 2, mode).total for mode in ("was", "cas")]
    for tokens in (1, 64, 256):
        was, cas = steps(advisor.model, StepBatch.decode(tokens, advisor.context))
        assert was > cas
    was, cas = steps(advisor.model, StepBatch.prefill(crossover))
    assert was <= cas
    was, cas = steps(advisor.model, StepBatch.prefill(crossover - 1))
    assert was > cas
    eager = advisor.model.eager()
    assert advisor.sidp_crossover(1, 2, cas_graphs=False) == 113
    was, cas = steps(eager, StepBatch.decode(113, advisor.context))
    assert was <= cas
    was, cas = steps(eager, StepBatch.decode(112, advisor.context))
    assert was > cas
    four = advisor_for(config(), LLAMA_8B, 4)
    assert four.sidp_crossover(1, 4) == four.sidp_crossover(1, 4, cas_graphs=False) == 4666


def test_four_replicas_fetch_at_the_rate_every_gpu_reading_at_once_measured():
    advisor = advisor_for(config(), LLAMA_8B, 4)
    assert advisor.model.link.ranks == 4
    assert advisor.sidp_threshold(1, 4) == 2116  # 75.6 GB/s each: the fetch hides later
    assert advisor.sidp_threshold(1, 2) == 1466


def test_flying_predicts_an_unmeasured_merge_and_merges_light_load_only():
    costs = SwitchCosts(advisor=advisor_for(config(), LLAMA_8B, 4))
    light = NodeView((group(1),) * 4, 1.0, REPLICAS)
    assert costs.speedup(light, 4, ("merge4-tp4",)) == pytest.approx(1.70150091, rel=1e-6)
    assert costs.step_seconds(light) == pytest.approx(0.00499364, rel=1e-5)
    assert costs.merge_pays(light, 4, merged=("merge4-tp4",))
    heavy = NodeView((group(128, num_running=128, longest_decode_left=20),) * 4, 1.0, REPLICAS)
    assert costs.speedup(heavy, 4, ("merge4-tp4",)) == pytest.approx(0.94829049, rel=1e-6)
    assert not costs.merge_pays(heavy, 4, merged=("merge4-tp4",))
    # measured steps still win over the model
    measured = NodeView((group(1),) * 4, 1.0, REPLICAS,
                        decode_step_s=(("single", 0.005), ("merge4-tp4", 0.006)))
    assert costs.speedup(measured, 4, ("merge4-tp4",)) == pytest.approx(0.005 / 0.006)


def test_seesaw_auto_over_the_profiles_rates_picks_a_static_plan_on_nvlink():
    """On four H200s over NVLink `summarize` ran DP4 86,330, DP2xTP2 84,998, TP4 75,777 and
    PP4->TP4 60,560 tok/s (benchmarks/results/seesaw.json): the pair is not chosen."""
    hardware = Hardware.from_profiles(*load_profiles(PROFILE, 4))
    shape = ModelShape(32, 4096, 32, 8, 128, 14336, 128256)
    choice = choose_plans(shape, hardware, Workload(3000, 200, num_requests=128,
                                                    tier_tokens=250_000), 4)
    assert choice.best.name == "dp4"  # the measured DP4 ran 86,330 tok/s, the best row
    assert [s.name for s in choice.table[:3]] == ["dp4", "dp2xpp2", "dp2xtp2"]
    assert choice.table[6].name == "pp4->tp4"


def test_flying_takes_a_merged_groups_efficiency_from_the_model_not_the_default():
    """With the cost model the share of k times a replica's pace a merged group keeps is the
    plans' predicted steps' (the default 0.8 is for a node without a profile): four 8B
    replicas merged keep 0.43 of 4x at one request each and 0.29 at 64 each."""
    costs = SwitchCosts(advisor=advisor_for(config(), LLAMA_8B, 4))
    light = NodeView((group(1),) * 4, 1.0, REPLICAS)
    assert costs.merged_efficiency(light, 4, ("merge4-tp4",), REPLICAS) == pytest.approx(
        0.42537523, rel=1e-6)
    assert costs.merged_efficiency(light, 4, ("merge4-tp4",), REPLICAS) == pytest.approx(
        costs.speedup(light, 4, ("merge4-tp4",)) / 4, rel=1e-9)
    heavy = NodeView((group(64, num_running=64, longest_decode_left=20),) * 4, 1.0, REPLICAS)
    assert costs.merged_efficiency(heavy, 4, ("merge4-tp4",), REPLICAS) == pytest.approx(
        0.28621288, rel=1e-6)
    assert SwitchCosts().merged_efficiency(heavy, 4, ("merge4-tp4",), REPLICAS) == 0.8
    merged = NodeView((group(256, plan="merge4-tp4", num_running=256, longest_decode_left=200,
                             num_waiting=4, tokens_waiting=4000),), 1.0, ("merge4-tp4",))
    kept = costs.merged_efficiency(merged, 4, ("merge4-tp4",), REPLICAS)
    queued = 4000 / costs.prefill_rate(merged) * 0.75 + 4 * costs.step_seconds(merged)
    assert costs.split_gain(merged, 4, True, REPLICAS) == pytest.approx(
        queued + 200 * costs.step_seconds(merged) * (1 - kept), rel=1e-12)


def flying_costs_2gpu():
    costs = SwitchCosts(advisor=advisor_for(config(), LLAMA_8B, 2))
    return costs, FlyingPolicy(Layout.of(Plan(dp=2)), 32, 8, costs=costs)


def queued(waiting: int, prompt: int, need: int, plan: str, running: int = 0,
           decode_left: int = 0, recompute: int = 0) -> GroupView:
    return GroupView(plan, num_waiting=waiting, num_running=running,
                     tokens_waiting=waiting * prompt, next_step_tokens=0, kv_blocks_used=0,
                     kv_blocks_free=100, longest_need=need, longest_decode_left=decode_left,
                     recompute_tokens=recompute)


TWO = ("single", "single@1")


def test_flying_with_the_model_picks_the_width_that_finishes_the_work_in_hand_first():
    """64 queued requests on two 8B replicas: 1024-token prompts with 62 tokens out (the
    simulator's scaled `batch`) finish sooner split, 300-token prompts with 1024 out (`chat`)
    sooner merged; the predicted seconds are the prompts at the plans' prompt rates plus the
    longest decode in steps of the requests spread over the groups."""
    costs, policy = flying_costs_2gpu()
    advisor, single, merged = costs.advisor, Plan(), Plan.parse("merge2-tp2")
    prefill_heavy = NodeView((queued(32, 1024, 1086, "single"),
                              queued(32, 1024, 1086, "single@1")), 0.0, TWO)
    split_s = 65536 / (2 * advisor.prefill_tokens_per_s(single)) + 62 * advisor.decode_step_s(
        single, 32)
    merged_s = 65536 / advisor.prefill_tokens_per_s(merged) + 62 * advisor.decode_step_s(
        merged, 64)
    assert costs.work_s(prefill_heavy, TWO) == pytest.approx(split_s, rel=1e-12)
    assert costs.work_s(prefill_heavy, ("merge2-tp2",)) == pytest.approx(merged_s, rel=1e-12)
    assert (split_s, merged_s) == pytest.approx((1.21474531, 1.33706026), rel=1e-6)
    assert costs.fastest_width(prefill_heavy, policy.layouts) == 1
    assert policy.decide(prefill_heavy).transitions == ()
    decode_heavy = NodeView((queued(32, 300, 1324, "single"),
                             queued(32, 300, 1324, "single@1")), 0.0, TWO)
    assert costs.fastest_width(decode_heavy, policy.layouts) == 2
    (merge,) = policy.decide(decode_heavy).transitions
    assert (merge.kind, merge.target) == ("merge", ("merge2-tp2",))


def test_flying_with_the_model_merges_only_when_the_gain_covers_the_recompute():
    """Mid-run, 24 running (1024 tokens computed each, 100 to go) and 8 queued per replica:
    merged the rest would finish 51 ms sooner, but moving the running requests recomputes 49,152
    tokens (about 0.76 s at TP2's prompt rate): no merge; kept where they are, it pays."""
    costs, policy = flying_costs_2gpu()
    mid = NodeView((queued(8, 1024, 1124, "single", 24, 100, 24 * 1024),
                    queued(8, 1024, 1124, "single@1", 24, 100, 24 * 1024)), 0.6, TWO)
    gain = costs.work_s(mid, TWO) - costs.work_s(mid, ("merge2-tp2",))
    assert gain == pytest.approx(0.05115048, rel=1e-5)
    assert not costs.switch_pays(mid, ("merge2-tp2",), moves_running=True)
    assert costs.switch_pays(mid, ("merge2-tp2",), moves_running=False)
    assert policy.decide(mid).transitions == ()  # a load merge moves them (recompute)


def test_flying_with_the_model_merges_an_idle_node():
    _, policy = flying_costs_2gpu()
    idle = NodeView((queued(0, 0, 0, "single"), queued(0, 0, 0, "single@1")), 0.0, TWO)
    (merge,) = policy.decide(idle).transitions
    assert merge.target == ("merge2-tp2",)


def test_flying_counts_a_waiting_requests_output_by_its_max_tokens():
    """64 queued summaries (786-token prompts, 50 output tokens, the longest need 3000): with
    the view's `waiting_decode_most` the work in hand is mostly prompt, and two TP2 groups
    finish it first (0.4% before one replica per GPU); without it (a recorded view), need less
    the mean prompt stands in for the output, 2214 decode steps, and the widest group wins."""
    costs = SwitchCosts(advisor=advisor_for(config(), LLAMA_8B, 4))
    layouts = {1: REPLICAS, 2: ("merge2-tp2", "merge2-tp2@2-3"), 4: ("merge4-tp4",)}

    def view(waiting_decode_most: int) -> NodeView:
        queued = GroupView("merge4-tp4", num_waiting=64, num_running=0, tokens_waiting=64 * 786,
                           next_step_tokens=8192, kv_blocks_used=0, kv_blocks_free=1000,
                           longest_need=3000, waiting_decode_most=waiting_decode_most)
        return NodeView((queued,), 0.0, ("merge4-tp4",))
    told = {w: costs.work_s(view(50), layout) for w, layout in layouts.items()}
    assert told == pytest.approx({1: 0.5967, 2: 0.5937, 4: 0.6680}, abs=1e-4)
    assert costs.fastest_width(view(50), layouts) == 2
    assert costs.fastest_width(view(0), layouts) == 4


def test_flying_keeps_its_width_where_another_is_within_the_tie_margin():
    """The same 64 summaries: one replica per GPU (0.5967 s) is within 2% of two TP2 groups
    (0.5937 s), so a node at width 1 stays; at width 4 (0.6680, 12% slower) it takes the
    widest of the tied; with no margin the fastest alone."""
    costs = SwitchCosts(advisor=advisor_for(config(), LLAMA_8B, 4))
    layouts = {1: REPLICAS, 2: ("merge2-tp2", "merge2-tp2@2-3"), 4: ("merge4-tp4",)}
    queued = GroupView("merge4-tp4", num_waiting=64, num_running=0, tokens_waiting=64 * 786,
                       next_step_tokens=8192, kv_blocks_used=0, kv_blocks_free=1000,
                       longest_need=3000, waiting_decode_most=50)
    view = NodeView((queued,), 0.0, ("merge4-tp4",))
    assert costs.fastest_width(view, layouts, current=1) == 1
    assert costs.fastest_width(view, layouts, current=4) == 2
    exact = SwitchCosts(advisor=costs.advisor, tie_margin=0.0)
    assert exact.fastest_width(view, layouts, current=1) == 2
    with pytest.raises(ValueError, match="tie_margin"):
        SwitchCosts(tie_margin=1.0)
