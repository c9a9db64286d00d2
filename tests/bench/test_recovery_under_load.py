"""benchmarks/recovery_under_load.py on the CPU: two data-parallel ranks of the tiny Llama
under a scaled `chat` load, one rank SIGKILLed mid-run (rank 1 with the engine in this
process; rank 0 with its core in a process of its own, as a server on a GPU host runs it);
every request ends with all its tokens, the loss and the recovery are timed, and the
replaced group serves again."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
NUM_REQUESTS = 24


@pytest.mark.parametrize("rank, core", [(1, "--no-engine-core-process"),
                                        (0, "--engine-core-process")])
def test_kill_under_load_loses_no_request(tmp_path, rank, core):
    out = tmp_path / "kill.json"
    subprocess.run([sys.executable, "benchmarks/recovery_under_load.py",
                    "--model", "benchmarks/shapes/tiny-llama.json", "--device", "cpu",
                    "-dp", "2", "--num-requests", str(NUM_REQUESTS), "--length-scale", "0.2",
                    "--kill-rank", str(rank), core, "--timeout-s", "90",
                    "--recovery-wait-s", "30", "--output", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=180,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    report = json.loads(out.read_text())
    requests = report["requests"]
    assert (requests["completed"], requests["failed"], requests["other"]) == \
        (NUM_REQUESTS, 0, 0), requests
    assert report["lost_ranks"] == [rank] and report["world_size"] == 2
    assert report["requests_on_lost_group"] > 0
    assert report["requests_on_lost_group_completed"] == report["requests_on_lost_group"]
    assert report["engine_faults"]["requests_requeued"] > 0
    assert report["engine_faults"]["worker_restarts"] == 1
    assert 0 < report["detection_s"] < report["serving_again_s"]
    assert report["replaced_serving_s"] >= report["serving_again_s"]
    assert report["probe"]["ranks"] is not None
    assert set(report["probe"]["requests_by_group_when_back"]) <= {"0", "1"}
    windows = report["throughput"]
    assert windows["before"]["output_tokens"] > 0 and windows["during"]["seconds"] > 0
    assert report["survivors_longest_stall_s"] >= 0
