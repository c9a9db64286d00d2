"""Offline forecasts (cost/forecast.py) of a pipelined plan: a request decodes in its stage
replica's batch, stepping as the stage replicas share the stages (exact arithmetic)."""
from parashift.cost.forecast import predict_offline
from parashift.cost.runs import Engine, Served, cycle_s, offline_s
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan
from tests.cost.test_runs_pipeline import LINKS
from tests.cost.test_step import SHAPE, compute


def test_a_pipelined_offline_forecast_decodes_a_stage_replicas_share_at_its_cycle():
    model, served = StepModel(SHAPE, compute(), LINKS), Served(Plan(pp=2))
    requests = [(100, 3)] * 8
    forecast = predict_offline(model, served, requests, Engine())
    assert forecast.tpot_s == cycle_s(model, served, StepBatch.decode(4, 100))
    assert forecast.throughput == 8 * 103 / offline_s(model, served, requests, Engine())
