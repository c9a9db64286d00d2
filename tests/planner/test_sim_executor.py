"""The simulator's executor on SiDP plans: a step of a plan sharing FFN weights takes the cost
model's SiDP step (CaS exchanges, WaS fetches), not a plain replica's, its KV pool is the one
beside 1/d of the FFN, and a CaS round's steps start together once every sharing rank is
free."""
from types import SimpleNamespace

import pytest

from parashift.cost.shape import load_shape
from parashift.cost.sidp import SLOTS, sidp_step
from parashift.cost.step import Seq, StepBatch, replica_plan
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan
from parashift.planner.recommend import node_model
from parashift.planner.sim_executor import SimulatedExecutor, VirtualClock


@pytest.fixture(scope="module")
def model():
    return node_model(load_shape("llama-3.1-8b"), 2, "h200")


def executor(model, *modes: str, cuda_graphs: bool | None = None) -> SimulatedExecutor:
    plans = [p for mode in modes for p in Layout.of(Plan(dp=2)).sharing_ffn(mode).plans]
    return SimulatedExecutor(model, VirtualClock(), plans, plans[:2], block_size=16,
                             cuda_graphs=cuda_graphs)


def decodes(plan: Plan, count: int, round_id: int = -1):
    return SimpleNamespace(plan=plan.name(), decode_starts=[1000] * count, chunks=[],
                           decode_ids=list(range(count)), round_id=round_id)


@pytest.mark.parametrize("mode", ["cas", "was"])
def test_a_shared_ffn_step_is_the_models_sidp_step(model, mode):
    run = executor(model, mode)
    plan = next(iter(run.plans.values()))
    seconds = run.step_seconds(plan.name(), decodes(plan, 8))
    want = sidp_step(model, plan, StepBatch((Seq(1, 1000),) * 8), 2, mode).total
    assert seconds == want
    assert seconds != model.step_s(replica_plan(plan), StepBatch((Seq(1, 1000),) * 8))
    held = model.kv_tokens(replica_plan(plan), ffn_owners=2, ffn_slots=SLOTS)
    assert run.rank_blocks == [held // 16] * 2 and held > model.kv_tokens(replica_plan(plan))


@pytest.mark.parametrize("cuda_graphs", [None, True, False])
def test_the_sidp_policys_cas_decodes_replay_graphs_unless_told_not_to(model, cuda_graphs):
    """Both modes' plans made (the sidp policy's): by default, as with --cuda-graphs, a CaS
    decode is priced in graphs and a WaS step eagerly (worker/model_runner.graphs_by_default);
    --no-cuda-graphs prices both eagerly."""
    run = executor(model, "cas", "was", cuda_graphs=cuda_graphs)
    batch = StepBatch((Seq(1, 1000),) * 8)
    cas_model = model.eager() if cuda_graphs is False else model
    for plan in run.plans.values():
        mode = plan.shared_ffn[0]
        want = sidp_step(cas_model if mode == "cas" else model.eager(), plan, batch, 2, mode)
        assert run.step_seconds(plan.name(), decodes(plan, 8)) == want.total
    cas = next(p for p in run.plans.values() if p.shared_ffn[0] == "cas")
    eager = sidp_step(model.eager(), cas, batch, 2, "cas").total
    assert (run.step_seconds(cas.name(), decodes(cas, 8)) < eager) is (cuda_graphs is not False)


def test_a_replica_without_tokens_in_a_cas_round_serves_its_slices_eagerly(model):
    """worker/shared_ffn.py serve_idle: no graph holds an empty step, so the replica's FFN
    exchanges are launched from its host layer by layer (`cas_kernels_per_peer` each)."""
    run = executor(model, "cas")
    plan = next(iter(run.plans.values()))
    c = model.compute
    idle = run.step_seconds(plan.name(), decodes(plan, 0, round_id=1))
    assert idle == model.shape.num_layers * c.cas_kernels_per_peer * c.eager_launch_s
    assert idle > sidp_step(model, plan, StepBatch(()), 2, "cas").total  # the graph's


def test_a_cas_round_starts_once_every_sharing_rank_is_free(model):
    run = executor(model, "cas")
    first, second = run.plans.values()
    run.busy_until = [0.5, 0.0]  # rank 0 still busy with the last round
    run.submit("a", first.ranks, first.ranks[0], decodes(first, 4, round_id=1))
    run.submit("b", second.ranks, second.ranks[0], decodes(second, 4, round_id=1))
    assert [step["start_s"] for step in run.steps] == [0.5, 0.5]
    run.busy_until[1] = 9.0
    run.submit("c", first.ranks, first.ranks[0], decodes(first, 4))  # no round: its own ranks
    assert run.steps[-1]["start_s"] == run.steps[0]["end_s"]


def test_steps_that_end_together_come_back_together(model):
    """As the real executors return every result ready: two replicas' equal steps end at
    once and one wait returns both; a later one waits for the next wait."""
    run = executor(model, "was")
    first, second = run.plans.values()
    run.submit("a", first.ranks, first.ranks[0], decodes(first, 4))
    run.submit("b", second.ranks, second.ranks[0], decodes(second, 4))
    run.submit("c", first.ranks, first.ranks[0], decodes(first, 4))
    assert [tag for tag, _ in run.wait_any()] == ["a", "b"]
    assert [tag for tag, _ in run.wait_any()] == ["c"]
    assert run.clock.now == run.steps[-1]["end_s"]


def test_a_replica_per_stage_keeps_both_stages_of_a_pipeline_busy():
    """Static PP=2 runs a replica per stage on the same ranks: the second replica's step
    enters stage 0 once the first's leaves it, not once the first's step ends."""
    model = node_model(load_shape("llama-3.1-8b"), 2, "h200")
    plan = Plan(pp=2)
    run = SimulatedExecutor(model, VirtualClock(), [plan], [plan], block_size=16)
    run.submit("a", plan.ranks, 1, decodes(plan, 8))
    run.submit("b", plan.ranks, 1, decodes(plan, 8))
    a, b = run.steps
    step = model.step(plan, StepBatch((Seq(1, 1000),) * 8))
    assert a["end_s"] - a["start_s"] == pytest.approx(step.total)
    assert b["start_s"] == pytest.approx(step.stage_s) and b["start_s"] < a["end_s"]
    # the last stage holds a step from its first micro-batch to its head
    assert b["end_s"] - a["end_s"] == pytest.approx(step.total - step.lag_s)
