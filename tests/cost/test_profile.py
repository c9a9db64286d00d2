"""Profiles: interpolation between measured points, the ring's scaling between group sizes,
the JSON schema and its errors, and the committed H200 profiles."""
import json
import math

import pytest

from parashift.cost.profile import Curve, LinkProfile, load, save, to_dict
from parashift.cost.shape import SHAPES

PROFILES = SHAPES.parent / "results" / "profiles"


def test_a_curve_interpolates_in_log_log_space_and_extrapolates_by_bandwidth():
    curve = Curve(((1000, 1e-5), (100000, 1e-3)))
    assert curve(1000) == 1e-5
    assert curve(10) == 1e-5                      # below: the smallest point's latency
    assert math.isclose(curve(10000), 1e-4, rel_tol=1e-12)  # halfway in log space
    assert math.isclose(curve(200000), 2e-3, rel_tol=1e-12)  # above: the last bandwidth
    assert curve(0) == 0.0


def test_a_curve_refuses_bad_points():
    with pytest.raises(ValueError, match="bytes > 0"):
        Curve(((0, 1e-5),))
    with pytest.raises(ValueError, match="two points at one size"):
        Curve(((10, 1e-5), (10, 2e-5)))


POINTS = [[1000, 1e-5], [100000, 1e-3]]


def link(ranks: int = 2, names=("all_reduce", "all_gather")) -> LinkProfile:
    return LinkProfile(device="test", source="this test", ranks=ranks,
                       collectives={name: {"graph": POINTS} for name in names},
                       host_to_device_bytes_per_s=1e9, kv_tier_bytes_per_s=1e9)


def test_a_larger_group_moves_more_bytes_per_rank_in_a_ring():
    # all-reduce: 2(n-1)/n of the data per rank; 2 ranks: 1, 4 ranks: 1.5
    assert math.isclose(link().seconds("all_reduce", 10000, 4),
                        Curve(((1000, 1e-5), (100000, 1e-3)))(15000), rel_tol=1e-12)
    assert link().seconds("all_reduce", 10000, 1) == 0.0


def test_a_missing_collective_is_named():
    with pytest.raises(ValueError, match="has no all_to_all"):
        link().seconds("all_to_all", 1000, 2)


def test_schema_errors_are_clear(tmp_path):
    doc = to_dict(link())
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc | {"schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99"):
        load(path)
    path.write_text(json.dumps(doc | {"bogus": 1}))
    with pytest.raises(ValueError, match="unknown fields"):
        load(path)
    path.write_text(json.dumps({"kind": "weights"}))
    with pytest.raises(ValueError, match="not a profile"):
        load(path)


def test_a_profile_round_trips(tmp_path):
    save(link(), tmp_path / "l.json")
    assert load(tmp_path / "l.json") == link()


@pytest.mark.parametrize("name", ["h200_compute.json", "h200x2_link.json", "h200x4_link.json"])
def test_the_committed_profiles_load_and_name_their_source(name):
    profile = load(PROFILES / name)
    assert profile.device == "H200" and "docs/benchmark_log.md" in profile.source


def test_the_compute_profile_round_trips_with_its_timed_gemms(tmp_path):
    profile = load(PROFILES / "h200_compute.json")
    assert profile.gemm_timings(28672, 4096)[-1][0] == 1024  # the 8B's gate_up, 1-1,024 rows
    save(profile, tmp_path / "c.json")
    assert load(tmp_path / "c.json") == profile
