"""SiDP's step in the cost model (exact on hand-made profiles): Compute-as-a-Service runs
the FFN over every replica's rows at 1/d of the width plus two exchanges a layer;
Weight-as-a-Service exposes the fetch a layer's compute does not hide; the mode by B_th;
and what SiDP cannot share is an error."""
import math
from dataclasses import replace

import pytest

from parashift.cost.runs import Served, _rounds_s, kv_tokens, step_s
from parashift.cost.sidp import SLOTS, idle_cas_step, sidp_mode, sidp_step
from parashift.cost.step import StepBatch, StepModel
from parashift.cost.switch import sidp_fetch_s
from parashift.parallel.plan import Plan
from tests.cost.test_profile import link
from tests.cost.test_step import SHAPE, compute

LINKS = link(names=("all_reduce", "all_gather", "peer_copy"))


def test_cas_runs_every_replicas_rows_at_a_slice_of_the_width_and_exchanges_them():
    model = StepModel(SHAPE, compute(), LINKS)
    batch = StepBatch.decode(4, 9)
    base = model.step(Plan(), batch)
    cas = sidp_step(model, Plan(dp=2), batch, 2, "cas")
    exchange = 2 * LINKS.seconds("all_gather", 4 * 64 * 2, 2)
    per_layer = model.mlp_s(8, 2) + exchange - model.mlp_s(4, 1)
    assert math.isclose(cas.parts["ffn_cas"], 2 * per_layer, rel_tol=1e-12)
    assert math.isclose(cas.total, base.total + 2 * per_layer, rel_tol=1e-12)


def test_was_exposes_the_fetch_a_short_step_does_not_hide():
    model = StepModel(SHAPE, compute(), LINKS)
    batch = StepBatch.decode(1, 9)
    base = model.step(Plan(), batch)
    fetch = sidp_fetch_s(model, 1, 2)  # a layer's missing half at the peer rate: 1e-5 s
    was = sidp_step(model, Plan(dp=2), batch, 2, "was")
    assert fetch > base.total / 2  # the toy's layer computes in less than its fetch
    assert math.isclose(was.total, base.total + 2 * (fetch - base.total / 2), rel_tol=1e-12)


def test_the_mode_by_b_th_and_the_kv_of_shared_weights():
    assert sidp_mode(63, 64) == "cas" and sidp_mode(64, 64) == "was"
    assert sidp_mode(10**6, None) == "cas"  # no step hides the fetch: CaS always
    model = StepModel(SHAPE, compute(), LINKS)
    served = Served.sidp(Plan(dp=2), 1)
    assert served.name == "sidp-dp2" and served.ffn_owners == 2
    assert kv_tokens(model, served) == model.kv_tokens(Plan(), ffn_owners=2, ffn_slots=SLOTS)
    assert step_s(model, served, StepBatch.decode(4, 9)) == sidp_step(
        model, Plan(dp=2), StepBatch.decode(4, 9), 2, "was").total


def test_what_sidp_cannot_share_is_an_error():
    with pytest.raises(ValueError, match="link profile"):
        sidp_step(StepModel(SHAPE, compute()), Plan(dp=2), StepBatch.decode(1, 9), 2, "cas")
    fp8 = StepModel(SHAPE.quantized("fp8"), compute(), LINKS)
    with pytest.raises(ValueError, match="no MoE|refuses MoE"):
        sidp_step(fp8, Plan(dp=2), StepBatch.decode(1, 9), 2, "cas")
    with pytest.raises(ValueError, match="was or cas"):
        sidp_step(StepModel(SHAPE, compute(), LINKS), Plan(dp=2), StepBatch.decode(1, 9), 2, "x")


def test_an_eager_cas_step_launches_its_exchanges_from_every_peers_host():
    c = compute(eager_launch_s=1e-3, kernels_per_layer=3, cas_kernels_per_peer=4)
    model = StepModel(SHAPE, c, LINKS, graphs=False)
    batch = StepBatch.decode(4, 9)
    cas = sidp_step(model, Plan(dp=2), batch, 2, "cas")
    host = (3 * SHAPE.num_layers + 10) * 1e-3 + SHAPE.num_layers * 4 * 2 * 1e-3
    assert math.isclose(cas.total, host, rel_tol=1e-12)  # host-bound: launches, not kernels
    graphs = sidp_step(StepModel(SHAPE, c, LINKS), Plan(dp=2), batch, 2, "cas")
    assert graphs.total < host / 10  # a decode round in graphs launches nothing


def test_was_steps_run_eagerly_though_the_model_replays_graphs():
    c = compute(eager_launch_s=1e-3, kernels_per_layer=3)
    was = sidp_step(StepModel(SHAPE, c, LINKS), Plan(dp=2), StepBatch.decode(4, 9), 2, "was")
    assert was.total >= (3 * SHAPE.num_layers + 10) * 1e-3


def test_replicas_sharing_ffn_weights_step_in_rounds_an_idle_one_serving_eagerly():
    """Each round takes its slowest replica's step; a CaS round that a replica done with its
    share sits in takes at least that replica's eager serving (`idle_cas_step`); a WaS
    round does not wait on it."""
    model = StepModel(SHAPE, replace(compute(), cas_kernels_per_peer=10), LINKS)
    idle = idle_cas_step(model).total
    assert idle == SHAPE.num_layers * 10 * model.compute.eager_launch_s
    short, fast = idle / 4, idle / 2
    uneven = [[(3, fast, True)], [(1, 2 * idle, True), (4, short, True)]]
    assert math.isclose(_rounds_s(model, uneven), 2 * idle + 2 * fast + 2 * idle,
                        rel_tol=1e-12)
    was_tail = [[(3, fast, True)], [(1, 2 * idle, True), (4, short, False)]]
    assert math.isclose(_rounds_s(model, was_tail), 2 * idle + 2 * fast + 2 * short,
                        rel_tol=1e-12)
