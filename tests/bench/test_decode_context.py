"""benchmarks/decode_context.py reproduces the mean context decode_throughput.py recorded for
its timed steps (issue 58's and 60's raw outputs), so the validation's decode rows are
predicted at the context they ran at."""
import json
from pathlib import Path

import pytest

from tests.bench.benchmark_scripts import ROOT, load_benchmark

decode_context = load_benchmark("decode_context")
RAW = ROOT / "benchmarks" / "results" / "raw"
RUNS = [("issue58_decode_ab/decode_after_1.json", 32), ("issue60_fp8_e2e/call7_gemv/"
        "decode_after_1.json", 32), ("issue60_fp8_e2e/decode_70b_fp8.json", 16)]


@pytest.mark.parametrize("path,steps", RUNS)
def test_the_recorded_mean_contexts_are_reproduced(path, steps):
    rows = json.loads((RAW / path).read_text())["rows"]
    for row in rows:  # every run on a GPU of >= 70 GiB since 2026-11-27: budget 16,384
        mean = decode_context.mean_context(row["context"], row["batch"], steps, 16384)
        if row["batch"] > 1:
            assert mean == row["mean_context"]
        else:  # a process's first batch: one token more (one more step before the timing)
            assert row["mean_context"] - mean in (0.0, 1.0)


def test_prompts_prefilled_over_more_steps_decode_longer_before_the_timing():
    one_step = decode_context.mean_context(1024, 8, 32, 16384)
    assert one_step == 1024 + 3 + 16  # prefilled at once: the warm-up and half the timed steps
    assert decode_context.mean_context(1024, 256, 32, 8192) > decode_context.mean_context(
        1024, 256, 32, 16384) > one_step
    assert decode_context.decode_context(1024, 1024, 16, 8192) == 1105


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="positive sizes"):
        decode_context.mean_context(1024, 0, 32, 8192)
