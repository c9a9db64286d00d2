"""The link profile a node is priced with (cost/links.py) and the committed PCIe-like
profiles (benchmarks/cost_profiles_pcie.py): exact arithmetic on their curves and steps."""
import json

import pytest

from parashift.cost.advisor import load_profiles
from parashift.cost.links import choose_link, committed_links
from parashift.cost.profile import load
from parashift.cost.shape import load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan
from parashift.planner.recommend import PROFILES

RATE, LATENCY = 30.87e9, 20e-6  # the fitted rate (bytes per rank, two ranks), the assumed latency
ONE_SHOT = 4 * 2**20


@pytest.fixture(scope="module")
def pcie2():
    return load(PROFILES / "h200x2_pcie_link.json")


@pytest.fixture(scope="module")
def nvlink2():
    return load(PROFILES / "h200x2_link.json")


def test_nccl_paths_cost_the_latency_plus_bytes_over_the_fitted_rate(pcie2):
    assert pcie2.link == "pcie-like" and pcie2.ranks == 2
    assert "30.87 GB/s" in json.dumps(pcie2.notes)
    for name in ("all_reduce", "all_gather", "all_to_all", "send_recv", "peer_copy"):
        assert pcie2.seconds(name, 2**28, 2) == pytest.approx(LATENCY + 2**28 / RATE, rel=1e-12)
    assert pcie2.seconds("peer_copy", 2**30, 2) == pytest.approx(LATENCY + 2**30 / RATE, rel=1e-12)
    eager_floor = 40.2e-6  # the NVLink profile's eager launch
    assert pcie2.seconds("all_gather", 8 * 1024, 2, graph=False) == eager_floor
    assert pcie2.seconds("all_gather", 8 * 1024, 2) == pytest.approx(LATENCY + 8 * 1024 / RATE)


def test_small_all_reduces_keep_the_nvlink_one_shot_curve(pcie2, nvlink2):
    for nbytes in (8 * 1024, 64 * 1024, 2**20, 3 * 2**20, ONE_SHOT):
        for graph in (True, False):
            assert pcie2.seconds("all_reduce", nbytes, 2, graph) == pytest.approx(
                nvlink2.seconds("all_reduce", nbytes, 2, graph), rel=1e-12)


def test_a_tp2_step_adds_the_all_reduces_by_their_size(pcie2, nvlink2):
    shape, compute = load_shape("llama-3.1-8b"), load(PROFILES / "h200_compute.json")
    pcie, nvlink = StepModel(shape, compute, pcie2), StepModel(shape, compute, nvlink2)
    prefill = pcie.step(Plan(tp=2), StepBatch.prefill(32768))  # 256 MiB a call, eager
    calls = 2 * shape.num_layers
    assert prefill.parts["all_reduce"] == pytest.approx(calls * (LATENCY + 2**28 / RATE), rel=1e-12)
    decode = StepBatch.decode(64, 1024)  # 512 KiB a call: the one-shot path
    assert pcie.step(Plan(tp=2), decode).parts["all_reduce"] == pytest.approx(
        nvlink.step(Plan(tp=2), decode).parts["all_reduce"], rel=1e-12)
    gather = 64 * (shape.vocab // 2) * 4  # the LM head's logits, through NCCL
    assert pcie.step(Plan(tp=2), decode).parts["all_gather"] == pcie2.seconds(
        "all_gather", gather, 2)
    assert pcie2.seconds("all_gather", gather, 2) > 9 * nvlink2.seconds("all_gather", gather, 2)


def test_four_ranks_move_a_ring_share_more_at_the_same_rate():
    pcie4 = load(PROFILES / "h200x4_pcie_link.json")
    assert pcie4.ranks == 4 and pcie4.link == "pcie-like"
    assert pcie4.seconds("all_reduce", 2**28, 4) == pytest.approx(
        LATENCY + 1.5 * 2**28 / RATE, rel=1e-12)
    assert pcie4.seconds("send_recv", 2**28, 2) == pytest.approx(LATENCY + 2**28 / RATE, rel=1e-12)


def test_a_link_is_chosen_by_name_width_or_file(tmp_path, pcie2):
    assert choose_link(PROFILES, "h200", 2, "pcie").ranks == 2
    assert choose_link(PROFILES, "h200", 3, "pcie").ranks == 4
    assert choose_link(PROFILES, "h200", 8, "pcie").ranks == 4  # the widest, scaled
    assert choose_link(PROFILES, "h200", 2).link == "nvlink"
    assert choose_link(PROFILES, "h200", 1, "pcie") is None
    assert choose_link(PROFILES, "h200", 2, str(PROFILES / "h200x2_pcie_link.json")) == pcie2
    assert set(committed_links(PROFILES, "h200")) == {2, 4}
    assert all("pcie" not in p.name for p in committed_links(PROFILES, "h200").values())


@pytest.mark.parametrize("spec,message", [
    ("infiniband", "unknown link profile 'infiniband': give one of nvlink, pcie"),
    ("missing.json", "unknown link profile 'missing.json'"),
    (str(PROFILES / "h200_compute.json"), "a compute profile, not a link profile"),
])
def test_an_unknown_link_is_a_clear_error(spec, message):
    with pytest.raises(ValueError, match=message):
        choose_link(PROFILES, "h200", 2, spec)


def test_no_pcie_profile_of_a_kind_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no pcie link profile of a100"):
        choose_link(tmp_path, "a100", 2, "pcie")
    assert choose_link(tmp_path, "a100", 2) is None  # as before: no NVLink profile, no link


def test_the_engine_advisor_keeps_the_nvlink_profile():
    _, link = load_profiles(str(PROFILES / "h200_compute.json"), 2)
    assert link.link == "nvlink" and link.ranks == 2
