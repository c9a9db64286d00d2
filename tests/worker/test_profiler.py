"""LLM.start_profile / stop_profile: every rank profiles its own steps (the engine's process
does not run a multi-rank plan's model) and answers its operations' time; traces per rank."""
import json

import pytest

from parashift import SamplingParams
from parashift.worker.profiler import covered_us
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def op_names(summary: dict) -> set[str]:
    return {name for name, _, _ in summary["host_ms"]}


def test_one_rank_answers_its_operations(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir)
    try:
        llm.start_profile()
        llm.generate([[1, 2, 3, 4, 5]], PARAMS)
        summary, = llm.stop_profile()
        assert summary["rank"] == 0 and summary["trace"] is None
        assert any("mm" in name or "linear" in name for name in op_names(summary))
        assert all(ms > 0 and calls >= 1 for _, ms, calls in summary["host_ms"])
        busy = summary["busy_ms"]
        assert 0 < busy["host"] <= busy["span"] and busy["device"] == 0  # no device on a CPU
        with pytest.raises(RuntimeError, match="no profile is running"):
            llm.stop_profile()
    finally:
        llm.shutdown()


def test_each_rank_of_tp2_writes_its_trace(tiny_llama_dir, tmp_path, monkeypatch):
    llm = tiny_llm(tiny_llama_dir, tensor_parallel_size=2)
    # set once the ranks run (start_profile reads it): a PARASHIFT_ variable set before
    # would spawn them, each importing torch, instead of forking them (process_start.py)
    monkeypatch.setenv("PARASHIFT_TORCH_PROFILER_DIR", str(tmp_path))
    try:
        llm.start_profile()
        with pytest.raises(RuntimeError, match="already running"):
            llm.start_profile()
        llm.generate([[1, 2, 3, 4, 5], [6, 7, 8]], PARAMS)
        summaries = llm.stop_profile()
    finally:
        llm.shutdown()
    assert [s["rank"] for s in summaries] == [0, 1]
    for summary in summaries:
        assert summary["trace"] == str(tmp_path / f"rank{summary['rank']}.trace.json")
        with open(summary["trace"]) as f:
            assert json.load(f)["traceEvents"]
        names = op_names(summary)
        assert any("mm" in name or "linear" in name for name in names)
        assert any("all_reduce" in name or "allreduce" in name for name in names), names


def test_covered_time_is_the_union_of_the_intervals():
    assert covered_us([]) == 0
    assert covered_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # 0-12 and 20-25
    assert covered_us([(20, 25), (0, 10)]) == 15


def test_runtime_calls_are_the_cuda_api_by_host_time():
    from types import SimpleNamespace
    from parashift.worker.profiler import runtime_calls
    averages = [SimpleNamespace(key=k, self_cpu_time_total=us, count=n) for k, us, n in [
        ("cudaLaunchKernel", 3000, 300), ("cuLaunchKernelEx", 9000, 500),
        ("cudaStreamSynchronize", 40000, 48), ("aten::mm", 8000, 10), ("cuda_graph", 1, 1),
        ("cudnn_generated_fort", 500, 5)]]
    assert runtime_calls(averages) == [("cudaStreamSynchronize", 40.0, 48),
                                       ("cuLaunchKernelEx", 9.0, 500),
                                       ("cudaLaunchKernel", 3.0, 300)]
