"""The benchmark client against a live parashift server (embedded model), and the
offline throughput benchmark on a tiny random model."""
import csv
import json

import pytest

from parashift.bench.cli import main as bench_main
from parashift.bench.serve import ServeBenchConfig, run_serve_benchmark
from parashift.bench.stats import SLO
from parashift.bench.throughput import ThroughputConfig, run_throughput_benchmark
from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import running_server, shared_engine

OPTIONS = WorkloadOptions(seed=0, num_requests=10, length_scale=0.03, request_rates=(8.0,))


@pytest.fixture(scope="module")
def server():
    with running_server(shared_engine()) as srv:
        yield srv


def test_chat_workload_gives_sane_numbers_and_files(server, tmp_path):
    config = ServeBenchConfig(workload="chat", base_url=server.base_url, options=OPTIONS,
                              vocab_size=shared_engine().vocab_size, output_dir=str(tmp_path),
                              slo=SLO(ttft_ms=60_000, tpot_ms=60_000), plot=True,
                              timeline_interval_s=0.5, metrics_interval_s=0.2)
    (phase,) = run_serve_benchmark(config)
    summary = phase["summary"]
    requests = build_phases(get_workload("chat"), OPTIONS)[0].requests
    assert summary["completed"] == 10 and summary["failed"] == 0
    assert summary["input_tokens"] == sum(r.input_len for r in requests)
    assert summary["output_tokens"] == sum(r.output_len for r in requests)
    assert 0 < summary["ttft_ms"]["median"] <= summary["e2el_ms"]["median"]
    assert 0 < summary["tpot_ms"]["mean"] < summary["e2el_ms"]["mean"]
    assert summary["itl_ms"]["p99"] >= summary["itl_ms"]["median"] > 0
    assert summary["request_throughput"] == pytest.approx(10 / summary["duration_s"])
    assert summary["goodput"] == pytest.approx(summary["request_throughput"])
    assert summary["peak_output_throughput"] >= summary["output_throughput"] * 0.5

    per_request = json.loads(open(phase["files"]["requests"]).read())
    assert len(per_request) == 10 and all(r["success"] for r in per_request)
    with open(phase["files"]["timeline"]) as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["started"]) for r in rows) == 10
    assert any(r["plan"] for r in rows) and any(r["server_running"] for r in rows)
    with open(phase["files"]["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "chat-summary.json").read_text())
    assert saved["phases"][0]["summary"]["completed"] == 10


def test_cli_sweep_over_chat_endpoint(server, tmp_path, capsys):
    bench_main(["serve", "--base-url", server.base_url, "--workload", "interactive",
                "--endpoint", "chat", "--num-requests", "2", "--length-scale", "0.005",
                "--request-rate", "inf,20", "--output-dir", str(tmp_path), "--plot"])
    printed = capsys.readouterr().out
    assert "interactive / rateinf" in printed and "interactive / rate20" in printed
    saved = json.loads((tmp_path / "interactive-summary.json").read_text())
    assert [p["summary"]["completed"] for p in saved["phases"]] == [2, 2]
    assert (tmp_path / "interactive-sweep.png").exists()


def test_errors_are_counted_not_raised(server, tmp_path):
    config = ServeBenchConfig(workload="batch", base_url=server.base_url, model="nope",
                              options=WorkloadOptions(num_requests=2, length_scale=0.002),
                              output_dir=str(tmp_path))
    (phase,) = run_serve_benchmark(config)
    assert phase["summary"]["failed"] == 2 and "404" in phase["summary"]["errors"][0]


def test_offline_throughput(tmp_path):
    model_dir = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "throughput.json"
    config = ThroughputConfig(
        workload="chat", output_json=str(out),
        engine_options=dict(model=model_dir, device="cpu", dtype="float32",
                            skip_tokenizer_init=True, num_blocks=512),
        options=WorkloadOptions(num_requests=8, length_scale=0.05))
    result = run_throughput_benchmark(config)
    assert result["num_requests"] == 8 and result["total_token_throughput"] > 0
    assert result["output_tokens"] == sum(
        r.output_len for r in build_phases(get_workload("chat"), config.options)[0].requests)
    assert json.loads(out.read_text())["workload"] == "chat"


def test_throughput_refuses_online_workloads():
    with pytest.raises(ValueError, match="not offline"):
        ThroughputConfig(workload="bursty")


def test_cli_random_dataset_as_vllm(server, tmp_path):
    bench_main(["serve", "--base-url", server.base_url, "--dataset-name", "random",
                "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "4",
                "--random-range-ratio", "0.5", "--vocab-size", str(shared_engine().vocab_size),
                "--output-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "random-summary.json").read_text())["phases"][0]["summary"]
    assert summary["completed"] == 3 and summary["failed"] == 0
    assert 3 * 4 <= summary["input_tokens"] <= 3 * 12
    assert 3 * 2 <= summary["output_tokens"] <= 3 * 6


def test_cli_sharegpt_dataset_counts_lengths_with_the_model_s_tokenizer(server, tmp_path):
    from parashift.bench.datasets import bench_tokenizer
    turns = [("What is the capital of France?", "The capital of France is Paris."),
             ("Name three colours of the rainbow.", "Red, orange and yellow are three.")]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": q},
                                                   {"from": "gpt", "value": a}]}
                                for q, a in turns]))
    bench_main(["serve", "--base-url", server.base_url, "--dataset-name", "sharegpt",
                "--dataset-path", str(path), "--num-prompts", "2", "--sharegpt-output-len", "4",
                "--output-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "sharegpt-summary.json").read_text())["phases"][0]["summary"]
    tokenizer = bench_tokenizer(None)
    assert summary["completed"] == 2
    assert summary["input_tokens"] == sum(len(tokenizer.encode(q)) for q, _ in turns)


@pytest.mark.parametrize("backend, endpoint, workload", [
    ("openai", "/v1/completions", ["--dataset-name", "random", "--num-prompts", "2",
                                   "--random-input-len", "8", "--random-output-len", "3"]),
    ("openai-chat", "/v1/chat/completions", ["--workload", "interactive", "--num-requests",
                                             "2", "--length-scale", "0.005"])])
def test_cli_takes_vllm_s_backend_host_port_and_endpoint(server, tmp_path, backend, endpoint,
                                                         workload):
    """`vllm bench serve --backend openai-chat --host H --port P --endpoint /v1/chat/...`."""
    host, port = server.base_url.removeprefix("http://").split(":")
    bench_main(["serve", "--backend", backend, "--host", host, "--port", port,
                "--endpoint", endpoint, *workload, "--vocab-size",
                str(shared_engine().vocab_size), "--output-dir", str(tmp_path)])
    (summary_file,) = tmp_path.glob("*-summary.json")
    summary = json.loads(summary_file.read_text())["phases"][0]["summary"]
    assert summary["completed"] == 2 and summary["failed"] == 0
