"""benchmarks/step_census.py: an offline run's steps by the kind of graph (or none) they run
as, through the simulator."""
from parashift.bench.workloads import BenchRequest
from tests.bench.benchmark_scripts import load_benchmark

step_census = load_benchmark("step_census")


def step(*lengths):
    return {"chunks": [(str(i), n, 0) for i, n in enumerate(lengths)]}


def test_a_step_is_named_by_the_graph_the_engine_would_replay():
    assert step_census.kind(step(1, 1, 1)) == "graph decode"
    assert step_census.kind(step(300, *[1] * 63)) == "mixed graph"
    assert step_census.kind(step(300, *[1] * 64)).startswith("eager: prefill beside > 64")
    assert step_census.kind(step(2049)) == "prefill of > 2048 rows"


def test_a_run_under_tp2_counts_every_step_once():
    requests = [BenchRequest(i, 100, 4, 0.0) for i in range(8)]
    result = step_census.census("tp2", "llama-3.1-8b", 16384, requests)
    kinds = result["kinds"]
    assert {what for _, what in kinds} == {"mixed graph", "graph decode"}
    assert sum(n for n, _ in kinds.values()) == 4  # one prefill step, three decodes
    assert sum(s for _, s in kinds.values()) <= result["duration_s"] + 1e-9
    assert step_census.config_of("shift-sp2", "llama-3.1-8b", 8192).parallel_policy == "shift"
