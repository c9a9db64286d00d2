"""benchmarks/sidp_probe.py's arithmetic (the fetch per step, B_th, the layer
extrapolation) and its CPU smoke run writing the JSON the sidp policy reads."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.bench.benchmark_scripts import load_benchmark

ROOT = Path(__file__).parents[2]
QWEN3_32B = json.loads((ROOT / "benchmarks/shapes/qwen3-32b.json").read_text())


def probe():
    return load_benchmark("sidp_probe")


def test_fetch_per_step_is_the_unowned_share_of_the_ffn_weights():
    p = probe()
    assert p.ffn_bytes(QWEN3_32B) == 64 * 3 * 5120 * 25600 * 2  # 50.3 GB
    assert p.fetch_bytes(QWEN3_32B, d=2, tp=1) == p.ffn_bytes(QWEN3_32B) / 2
    assert p.fetch_bytes(QWEN3_32B, d=4, tp=2) == p.ffn_bytes(QWEN3_32B) * 3 / 4 / 2


def test_threshold_is_the_least_batch_whose_step_covers_the_fetch():
    p = probe()
    steps = {1: 0.020, 64: 0.030, 256: 0.070, 1024: 0.200}
    fetch = 25.2e9  # bytes: 0.1125 s at 224 GB/s
    # 0.1125 s lies between T(256) = 0.07 and T(1024) = 0.2: 256 + 0.0425 / 0.13 * 768
    assert p.b_threshold(steps, fetch, 224, tp=1) == 508
    assert p.b_threshold(steps, fetch / 40, 224, tp=1) == 1  # the first batch covers it
    assert p.b_threshold(steps, fetch, 224, tp=2) is None  # 0.100 s < 0.1125 s


def test_extrapolation_keeps_the_fixed_cost_once():
    p = probe()
    # 2 ms fixed + 0.5 ms per layer: 3 ms at 2 layers, 5 ms at 6, 34 ms at 64
    assert abs(p.extrapolate(0.003, 0.005, 2, 6, 64) - 0.034) < 1e-12


def test_smoke_run_writes_thresholds(tmp_path):
    out = tmp_path / "sidp.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/sidp_probe.py"), "--smoke",
                    "--out", str(out)], check=True, cwd=ROOT, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(out.read_text())
    assert set(result["b_th"]) == {f"tiny-llama|d={d}|tp={t}" for d in (2, 4) for t in (1, 2)}
    assert result["p2p_gbps_assumed"] is True
    model = next(iter(result["step"]))
    assert result["step"][model]["layers_timed"] == [1, 2]
    assert set(result["step"][model]["step_ms"]) == {"1", "4"}
