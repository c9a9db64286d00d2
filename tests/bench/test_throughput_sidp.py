"""The offline throughput benchmark over SiDP's two data-parallel ranks (worker processes)
on a tiny random model (the in-process benchmarks: test_bench_live.py)."""
from parashift.bench.throughput import ThroughputConfig, run_throughput_benchmark
from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from tests.engine.conftest import save_tiny_llama


def test_offline_throughput_of_sidp_reports_its_rounds(tmp_path):
    """Under SiDP every replica takes part in each round: the result counts the rounds."""
    model_dir = save_tiny_llama(tmp_path / "tiny")
    config = ThroughputConfig(
        workload="tail", engine_options=dict(
            model=model_dir, device="cpu", dtype="float32", skip_tokenizer_init=True,
            num_blocks=256, data_parallel_size=2, share_ffn=True),
        options=WorkloadOptions(num_requests=8, length_scale=0.02))
    rounds = run_throughput_benchmark(config)["shared_ffn_rounds"]
    assert set(rounds) == {"padded_rounds", "counted_rounds", "exchanged_rounds"}
    longest = max(r.output_len for r in build_phases(get_workload("tail"),
                                                     config.options)[0].requests)
    assert rounds["padded_rounds"] + rounds["counted_rounds"] >= longest  # a round a token
