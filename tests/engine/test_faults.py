"""Which ranks a lost rank takes with it (engine/faults.py), as values."""
from parashift.engine.faults import FaultReport, GroupDown, lost_ranks, root_reason


def test_a_lost_rank_takes_the_ranks_it_steps_with():
    groups = [(0, 1), (2, 3), (4,)]
    assert lost_ranks({1}, groups) == {0, 1}
    assert lost_ranks({4}, groups) == {4}
    # a replica left behind by a merge with a step in flight over ranks 1-2 links two groups
    assert lost_ranks({0}, [*groups, (1, 2)]) == {0, 1, 2, 3}
    assert lost_ranks(set(), groups) == set()


def test_the_rank_that_died_is_named_before_the_peer_whose_collective_broke():
    lost = {0: "worker rank 0 failed:\nTraceback ... gloo connection closed",
            1: "worker rank 1 died (killed by SIGKILL)"}
    assert root_reason(lost) == "worker rank 1 died (killed by SIGKILL)"
    assert root_reason({0: "worker rank 0 failed:\ntrace"}) == "worker rank 0 failed"


def test_the_fault_report_names_the_groups_down():
    report = FaultReport(2, 1, (GroupDown("tp2", (0, 1), "worker rank 1 died"),), 3)
    assert report.as_json() == {
        "ranks_alive": 2, "groups_serving": 1, "requests_requeued": 3,
        "groups_down": [{"plan": "tp2", "ranks": [0, 1], "reason": "worker rank 1 died"}],
        "worker_restarts": 0, "recovery_seconds": None, "given_up": [],
        "requests_rebalanced": 0}


def test_the_policy_over_the_groups_left_picks_only_their_plans():
    from types import SimpleNamespace

    from parashift.designs.flying import FlyingConfig
    from parashift.engine.faults import policy_over
    from parashift.engine.policy import FlyingPolicy, StaticPolicy
    from parashift.parallel.layout import Layout
    config = SimpleNamespace(parallel_policy="flying", flying=FlyingConfig())
    heads = SimpleNamespace(num_attention_heads=8, num_key_value_heads=4)
    start = Layout.parse("single,single,single")
    made = {plan.name() for plan in FlyingPolicy(start, 8, 4).plans}
    aligned = policy_over(Layout.parse("merge2-tp2,single").without({2}), config, heads, made)
    assert isinstance(aligned, FlyingPolicy)  # over replicas 0 and 1, merged or not
    assert {p.name() for p in aligned.plans} == {"single", "single@1", "merge2-tp2"}
    gap = start.without({1})  # replicas 0 and 2: no merge of them was made
    assert isinstance(policy_over(gap, config, heads, made), StaticPolicy)
    alone = policy_over(start.without({0, 1}), config, heads, made)
    assert [p.name() for p in alone.plans] == ["single@2"]
