"""A pipelined plan's offline run in cost/runs.py (exact on hand-made profiles): a replica
per stage, each over its part of the pool, stepping as the simulator schedules stages
(a step's latency, or every stage busy with each replica's step in turn)."""
import math

from parashift.cost.runs import Engine, Served, cycle_s, kv_tokens, offline_s, stage_replicas
from parashift.cost.step import Seq, StepBatch, StepModel
from parashift.parallel.plan import Plan
from tests.cost.test_profile import link
from tests.cost.test_step import SHAPE, compute

LINKS = link(names=("all_reduce", "all_gather", "send_recv"))


def _model() -> StepModel:
    return StepModel(SHAPE, compute(), LINKS, micro_batch_tokens=256)


def test_a_stage_replica_steps_at_the_longer_of_its_latency_and_every_stage_busy_in_turn():
    model, served = _model(), Served(Plan(pp=2))
    for batch in (StepBatch.decode(8, 100), StepBatch.prefill(512)):
        step = model.step(Plan(pp=2), batch)
        assert cycle_s(model, served, batch) == max(step.total, 2 * step.stage_s)
    assert cycle_s(model, Served(Plan(tp=2)), StepBatch.decode(8, 100)) == \
        model.step_s(Plan(tp=2), StepBatch.decode(8, 100))
    assert stage_replicas(Served(Plan(pp=2), stage_replicas=False)) == 1


def test_a_pipelined_run_splits_its_requests_over_a_replica_per_stage():
    model, served = _model(), Served(Plan(pp=2))
    requests = [(100, 3)] * 4  # two a replica: one prefill step, then two decode steps
    prefill = cycle_s(model, served, StepBatch((Seq(100, 0),) * 2))
    decode = cycle_s(model, served, StepBatch.decode(2, 101 + 1))
    assert math.isclose(offline_s(model, served, requests, Engine()), prefill + 2 * decode,
                        rel_tol=1e-12)
    one = Served(Plan(pp=2), stage_replicas=False)  # Seesaw's: all four in one replica
    alone = (model.step_s(Plan(pp=2), StepBatch((Seq(100, 0),) * 4))
             + 2 * model.step_s(Plan(pp=2), StepBatch.decode(4, 102)))
    assert math.isclose(offline_s(model, one, requests, Engine()), alone, rel_tol=1e-12)


def test_each_stage_replica_seats_what_its_part_of_the_pool_holds():
    model, served = _model(), Served(Plan(pp=2))
    length = kv_tokens(model, served) // 2 // 2  # two sequences fill a part, four the pool
    requests = [(length - 1, 1)] * 6  # three a replica: two seated, then the third
    engine = Engine(max_num_batched_tokens=10 ** 9)
    rounds = (cycle_s(model, served, StepBatch((Seq(length - 1, 0),) * 2))
              + cycle_s(model, served, StepBatch.prefill(length - 1)))
    assert math.isclose(offline_s(model, served, requests, engine), rounds, rel_tol=1e-12)
