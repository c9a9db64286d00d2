"""benchmarks/plans.py and seesaw.py: plan names, and a plan that fails does not lose the rest."""
from types import SimpleNamespace

import pytest

from tests.bench.benchmark_scripts import load_benchmark


def test_a_plan_that_fails_to_start_gets_its_error_as_its_row(monkeypatch):
    plans = load_benchmark("plans")

    def no_memory(**options):  # as the 70B shape's SP4 on one H200: its weights do not fit
        raise RuntimeError("worker rank 0 failed to start: no memory left for the KV cache")
    monkeypatch.setattr(plans, "LLM", no_memory)
    args = SimpleNamespace(model="m", input_len=8, output_len=4, device="cpu", cuda_graphs=None)
    row = plans.run_plan("shift-sp4", plans.plan_options("shift-sp4"), args)
    assert row == {"plan": "shift-sp4", "error": "RuntimeError: worker rank 0 failed to start: "
                                                 "no memory left for the KV cache"}


def test_seesaw_groups_of_a_pair():
    seesaw = load_benchmark("seesaw")
    args = SimpleNamespace(cpu_kv_tokens=None, cpu_kv_gib=1.0, seesaw_max_prefill_ms=0.0,
                           seesaw_resident_weights=False, seesaw_weight_source="auto")
    options = seesaw.engine_options("dp2xseesaw:pp2-tp2", args)
    assert options == {**seesaw.engine_options("seesaw:pp2-tp2", args), "data_parallel_size": 2}
    assert options["prefill_plan"] == "pp2" and options["decode_plan"] == "tp2"
    with pytest.raises(ValueError):
        seesaw.engine_options("tp2xseesaw:pp2-tp2", args)
