"""benchmarks/moe_prefill.py's smoke run on the CPU (Triton interpreter, a tiny shape): the
sweep's rows, the calls' rows checked against the unfused path, and a tiles file that
kernels/moe_prefill.tiles_for reads."""
import json
import os
import subprocess
import sys

import torch

from parashift.kernels import moe_prefill
from tests.bench.benchmark_scripts import ROOT

SHAPE = {"num_experts": 4, "hidden_size": 64, "moe_intermediate_size": 48,
         "num_experts_per_tok": 2, "norm_topk_prob": True}


def test_smoke_run_writes_rows_and_a_tiles_file(tmp_path, monkeypatch):
    shape, out, tiles = tmp_path / "shape.json", tmp_path / "out.json", tmp_path / "tiles.json"
    shape.write_text(json.dumps(SHAPE))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_prefill.py"), "--model",
                    str(shape), "--tokens", "64", "--device", "cpu", "--output", str(out),
                    "--tiles-out", str(tiles), "--host-calls", "1"],
                   env=env, check=True, timeout=300, capture_output=True)
    doc = json.loads(out.read_text())
    gemms = [row["gemm"] for row in doc["rows"]]
    assert gemms.count("gate_up+silu") == 2 and "down" in gemms
    calls = [row for row in doc["rows"] if row["gemm"].startswith("experts call")]
    assert len(calls) == 3 and all(row["max_abs_diff"] < 1e-5 for row in calls)
    assert all(row["host_ms"] > 0 and row["host_ms_synced"] > 0 for row in calls)
    monkeypatch.setenv(moe_prefill.TILES_ENV, str(tiles))
    assert moe_prefill.tiles_for(torch.device("cpu")) == {
        **doc["best"], "gate_up": tuple(doc["best"]["gate_up"]),
        "down": tuple(doc["best"]["down"])}
    assert {row["schedule"] for row in doc["rows"] if row["gemm"] == "down"} == {"-", "nst"}
