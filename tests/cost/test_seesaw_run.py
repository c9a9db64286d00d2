"""Seesaw's run from the step model (cost/seesaw_run.py): its phases, as the group's one CPU
KV tier bounds them, and its switches' weights from the peers or the host."""
import pytest

from parashift.cost.profile import load
from parashift.cost.runs import Engine
from parashift.cost.seesaw_run import seesaw_s
from parashift.cost.shape import load_shape
from parashift.cost.step import StepModel
from parashift.cost.switch import kv_move_s, missing_weight_bytes, reshard_s
from parashift.parallel.plan import Plan
from parashift.planner.recommend import PROFILES

PREFILL, DECODE = Plan(pp=2), Plan(tp=2)


@pytest.fixture(scope="module")
def model():
    return StepModel(load_shape("llama-3.1-8b"), load(PROFILES / "h200_compute.json"),
                     load(PROFILES / "h200x2_pcie_link.json"))


def test_the_groups_one_tier_bounds_a_phase(model):
    """The tier holds `tier_bytes` of whole tokens for the group (engine/seesaw.py
    make_tiers), not that much a rank: 3 prompts of 600 tokens over a 1,000-token tier run
    as 3 phases, 3 switches to the decode plan and 2 back."""
    tier = 1000 * model.shape.kv_bytes_per_token
    reqs = [(600, 4)] * 3
    _, parts = seesaw_s(model, PREFILL, DECODE, reqs, tier, Engine(max_num_batched_tokens=1024))
    expected = (3 * reshard_s(model, PREFILL, DECODE) + 2 * reshard_s(model, DECODE, PREFILL)
                + 3 * kv_move_s(model, 600, 2))
    assert parts["switch"] == pytest.approx(expected, rel=1e-12)
    _, one = seesaw_s(model, PREFILL, DECODE, reqs, 3 * tier, Engine(max_num_batched_tokens=1024))
    assert one["switch"] == pytest.approx(
        reshard_s(model, PREFILL, DECODE) + kv_move_s(model, 1800, 2), rel=1e-12)


def test_weights_from_the_host_or_the_pcie_like_peers(model):
    nbytes = missing_weight_bytes(model.shape, PREFILL, DECODE)
    assert nbytes == model.shape.num_layers / 4 * model.shape.layer_bytes
    assert reshard_s(model, PREFILL, DECODE, from_peers=False) == pytest.approx(
        nbytes / model.compute.host_to_device_bytes_per_s, rel=1e-12)
    assert reshard_s(model, PREFILL, DECODE) == pytest.approx(
        model.link.seconds("peer_copy", nbytes, 2), rel=1e-12)
    reqs = [(600, 4)] * 2
    tier = 1000 * model.shape.kv_bytes_per_token
    _, host = seesaw_s(model, PREFILL, DECODE, reqs, tier, from_peers=False)
    _, peers = seesaw_s(model, PREFILL, DECODE, reqs, tier)
    assert host["switch"] - peers["switch"] == pytest.approx(3 * (
        reshard_s(model, PREFILL, DECODE, False) - reshard_s(model, PREFILL, DECODE)), rel=1e-9)


def test_a_run_that_starts_in_the_decode_plan_switches_to_prefill_first(model):
    """benchmarks/seesaw.py's runs follow one another on one engine: each logs two
    transitions a phase, the first back to the prefill plan."""
    reqs, tier = [(600, 4)] * 2, 1000 * model.shape.kv_bytes_per_token
    _, fresh = seesaw_s(model, PREFILL, DECODE, reqs, tier)
    _, again = seesaw_s(model, PREFILL, DECODE, reqs, tier, starts_in_decode=True)
    assert again["switch"] - fresh["switch"] == pytest.approx(
        reshard_s(model, DECODE, PREFILL), rel=1e-12)
    assert (again["prefill"], again["decode"]) == (fresh["prefill"], fresh["decode"])
