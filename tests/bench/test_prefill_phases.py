"""benchmarks/prefill_phases.py end to end on the CPU (a tiny FP8 model, one short prompt):
the timeline's points in order, the host's parts, the profiler's trace, cProfile's rows and
the variants, each variant's environment put back after."""
import json
import os
import sys

from tests.bench.benchmark_scripts import ROOT, load_benchmark


def test_a_prompts_phases_profiles_and_variants(tmp_path, monkeypatch):
    bench = load_benchmark("prefill_phases")
    monkeypatch.delenv("PARASHIFT_PDL", raising=False)
    output, traces = tmp_path / "phases.json", tmp_path / "traces"
    monkeypatch.setattr(sys, "argv", [
        "prefill_phases.py", "--model", str(ROOT / "benchmarks/shapes/tiny-llama.json"),
        "--prompt-len", "48", "--repeats", "1", "--quantization", "fp8", "--dtype", "float32",
        "--cprofile", "--trace-dir", str(traces), "--variants", "base", "PARASHIFT_PDL=0",
        "--ab-rounds", "1", "--output", str(output)])
    bench.main()
    result = json.loads(output.read_text())
    median = result["median"]
    assert 0 < median["host_forward_called"] < median["host_forward_returned"] <= \
        median["host_logits_called"] < median["host_wait_returned"] <= median["total_ms"]
    assert median["host_parts_ms"]["model_forward"] > 0 and "step_inputs" in median["host_parts_ms"]
    assert os.path.exists(result["profile"]["trace"]) and result["cprofile"]
    assert set(result["variants"]) == {"base", "PARASHIFT_PDL=0"}
    assert all(len(v["ms"]) == 1 for v in result["variants"].values())
    assert "PARASHIFT_PDL" not in os.environ
