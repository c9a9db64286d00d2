"""Shift Parallelism behind the server: the plan of every step reaches /metrics and
the benchmark's timeline (the Shift paper's Fig. 8 view)."""
import csv

from parashift.bench.serve import ServeBenchConfig, run_serve_benchmark
from parashift.bench.stats import SLO
from parashift.bench.workloads import WorkloadOptions
from parashift.config import EngineConfig
from parashift.engine.llm_engine import LLMEngine
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import metric_value, running_server


def test_steps_are_counted_by_plan_under_the_shift_policy(tmp_path):
    model = save_tiny_llama(tmp_path / "tiny", num_attention_heads=8, num_key_value_heads=2,
                            hidden_size=96, intermediate_size=192)
    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32",
                                    skip_tokenizer_init=True, num_blocks=128, max_num_seqs=8,
                                    sequence_parallel_size=2, parallel_policy="shift",
                                    shift_threshold=8))
    try:
        with running_server(engine) as server:
            options = WorkloadOptions(seed=0, num_requests=8, length_scale=0.02,
                                      request_rates=(50.0,))
            config = ServeBenchConfig(workload="chat", base_url=server.base_url, options=options,
                                      vocab_size=engine.vocab_size, output_dir=str(tmp_path),
                                      slo=SLO(ttft_ms=60_000, tpot_ms=60_000), plot=True,
                                      timeline_interval_s=0.2, metrics_interval_s=0.05)
            (phase,) = run_serve_benchmark(config)
            assert phase["summary"]["completed"] == 8
            steps = {plan: metric_value(server.base_url, "parashift_steps_total", plan=plan)
                     for plan in ("sp2", "shift-tp2")}
        assert steps["sp2"] > 0 and steps["shift-tp2"] > 0  # prefills over 8 tokens, decodes under
        with open(phase["files"]["timeline"]) as f:
            seen = {row["plan"] for row in csv.DictReader(f)}
        assert seen & {"sp2", "shift-tp2"}
    finally:
        engine.shutdown()
