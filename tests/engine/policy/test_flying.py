"""Flying told the workload (`flying_workload_file`, ... with `cost_profile`): it merges no
wider than the width whose layout the cost model predicts serves the workload best, on the
committed H200 profiles (8B shape, eight replicas)."""
import json
from types import SimpleNamespace

import pytest

from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from parashift.config import EngineConfig
from parashift.cost.shape import SHAPES
from parashift.engine.policy.flying import policy_from_config
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan

PROFILE = str(SHAPES.parent / "results" / "profiles" / "h200_compute.json")
LLAMA_8B = SimpleNamespace(**json.loads((SHAPES / "llama-3.1-8b.json").read_text()))
EIGHT = Layout.of(Plan(dp=8))


def flying(**options) -> EngineConfig:
    return EngineConfig(parallel_policy="flying", data_parallel_size=8, cost_profile=PROFILE,
                        max_num_batched_tokens=8192, **options)


def test_told_a_bursty_trace_it_merges_no_wider_than_dp2_x_tp4(tmp_path):
    """`bursty` as benchmarks/policy_vs_static.py runs it: the trace's best layout is two
    TP4 groups (simulated median E2E 207.1 ms against TP8's 213.0)."""
    requests = build_phases(get_workload("bursty"), WorkloadOptions(
        length_scale=0.25, time_scale=0.05))[0].requests
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([[r.input_len, r.output_len, r.arrival_s] for r in requests]))
    policy = policy_from_config(flying(flying_workload_file=str(trace)), EIGHT, LLAMA_8B)
    assert policy.widest == 4 and sorted(policy.layouts) == [1, 2, 4]
    untold = policy_from_config(flying(), EIGHT, LLAMA_8B)
    assert untold.widest == 8 and sorted(untold.layouts) == [1, 2, 4, 8]


def test_told_a_light_online_load_it_keeps_its_widest_merge():
    policy = policy_from_config(flying(flying_mean_prompt_tokens=1024, flying_request_rate=1.0),
                                EIGHT, LLAMA_8B)
    assert policy.widest == 8


def test_the_hints_need_the_cost_model_and_the_flying_policy():
    with pytest.raises(ValueError, match="flying_request_rate is an option of the flying "
                                         "policy with cost_profile"):
        EngineConfig(parallel_policy="flying", data_parallel_size=2, flying_request_rate=2.0)
    with pytest.raises(ValueError, match="flying_num_requests must be an integer >= 1"):
        flying(flying_num_requests=0)
