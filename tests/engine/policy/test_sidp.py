"""The sidp policy on made-up views: Compute-as-a-Service below B_th tokens per busy
replica, Weight-as-a-Service above, with 20% hysteresis and a least dwell; every sharing
replica in one mode."""
import re

import pytest

from parashift.engine.policy.protocol import GroupView, NodeView
from parashift.engine.policy.sidp import SidpPolicy
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def view(*tokens: int) -> NodeView:
    return NodeView(tuple(GroupView("", 0, 1, 0, n, 0, 10) for n in tokens))


def modes(policy: SidpPolicy, *tokens: int) -> set[str]:
    return {name.split("+")[1].split("/")[0] for name in policy.decide(view(*tokens)).plans}


def make(threshold=100, dwell=1, mode="cas") -> SidpPolicy:
    return SidpPolicy(Layout.of(Plan(dp=2)).sharing_ffn(mode), threshold, dwell)


def test_plans_of_both_modes_for_every_replica():
    policy = make()
    assert [p.name() for p in policy.plans] == ["single+cas/0-1", "single@1+cas/0-1",
                                                "single+was/0-1", "single@1+was/0-1"]


def test_hysteresis_around_the_threshold():
    policy = make()
    assert modes(policy, 110, 110) == {"cas"}  # past B_th but inside the band
    assert modes(policy, 121, 121) == {"was"}
    assert modes(policy, 90, 90) == {"was"}
    assert modes(policy, 79, 79) == {"cas"}


def test_busy_replicas_set_the_load():
    """An idle replica (no tokens) fetches nothing in WaS: it does not pull the mean down."""
    policy = make()
    assert modes(policy, 200, 0) == {"was"}
    assert modes(policy, 30, 0) == {"cas"}


def test_a_least_dwell_between_switches():
    policy = make(dwell=4)
    assert modes(policy, 500, 500) == {"was"}  # the first switch may come at once
    assert [modes(policy, 1, 1) for _ in range(4)] == [{"was"}] * 3 + [{"cas"}]
    assert policy.switches == 2


def test_needs_shared_ffn_replicas():
    with pytest.raises(ValueError, match="share FFN weights"):
        SidpPolicy(Layout.of(Plan(dp=2)), 100, 1)


def test_b_th_from_the_probe_json():
    from parashift.engine.policy.sidp import NEVER, probed_threshold
    path = "benchmarks/results/sidp_probe_h200.json"
    assert probed_threshold(path, "/models/Qwen3-32B", 2, 1) == 604
    assert probed_threshold(path, "benchmarks/shapes/llama-3.1-70b.json", 4, 2) == NEVER
    with pytest.raises(ValueError, match=re.escape("no B_th for 'qwen3-32b|d=8|tp=1'")):
        probed_threshold(path, "qwen3-32b", 8, 1)
