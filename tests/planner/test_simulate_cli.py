"""`parashift plan --simulate`: a workload through the simulated engine, reported as
`bench serve` reports it; its errors."""
import json

import pytest

from parashift.cli import main


def test_a_small_workload_completes_and_reports_like_bench_serve(capsys):
    main(["plan", "--simulate", "--model", "llama-3.2-1b", "-dp", "2", "--workload", "chat",
          "--num-requests", "6", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["ttft_ms"]["mean"] > 0 and summary["tpot_ms"]["mean"] > 0
    assert set(summary["steps_by_plan"]) == {"single", "single@1"}


@pytest.mark.parametrize("argv,message", [
    (("--model", "llama-3.2-1b"), "needs --model and --workload"),
    (("--model", "nope", "--workload", "chat"), "unknown model 'nope'"),
    (("--model", "llama-3.2-1b", "--workload", "chat", "--gpu-kind", "a100"),
     "no profile of GPU kind 'a100'"),
])
def test_errors_are_clear(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(["plan", "--simulate", *argv])


def test_fp8_weights_and_kv_step_faster_than_bf16(capsys):
    def tpot(*extra):
        main(["plan", "--simulate", "--model", "llama-3.2-1b", "--workload", "chat",
              "--num-requests", "4", "--json", *extra])
        return json.loads(capsys.readouterr().out)["tpot_ms"]["mean"]
    assert tpot("--quantization", "fp8", "--kv-cache-dtype", "fp8") < tpot()
    with pytest.raises(SystemExit, match="MoE experts refuse FP8"):
        main(["plan", "--simulate", "--model", "qwen3-30b-a3b", "--workload", "chat",
              "--quantization", "fp8"])
