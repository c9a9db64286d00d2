"""The committed H200 profiles are what benchmarks/cost_profiles.py derives from the log, the
validation table is what the model predicts from them, and every row that misses by more
than 25% says which part of the model is wrong."""
import json

from tests.bench.benchmark_scripts import load_benchmark

cost_profiles = load_benchmark("cost_profiles")
cost_validation = load_benchmark("cost_validation")


def test_the_profiles_are_derived_by_the_script():
    assert cost_profiles.main(["--check"]) == 0


def test_the_validation_json_is_current():
    assert cost_validation.main(["--check"]) == 0


def test_every_large_miss_and_one_gpu_step_off_by_5pct_is_explained():
    summary = cost_validation.evaluate()["summary"]
    assert set(summary["notes"]) == (set(summary["misses_over_25pct"])
                                     | set(summary["one_gpu_steps_over_5pct"]))
    assert "not yet explained" not in summary["notes"].values()


def test_the_gemm_overlap_is_fitted_to_the_ridge_steps_the_table_does_not_list():
    compute = cost_validation.COMPUTE
    assert compute.gemm.overlap > 0
    assert abs(cost_profiles.ridge_error(compute)) < 1e-3  # nil, but for the profile's rounding
    listed = {(r.shape, r.what) for r in cost_validation.rows()}
    for shape, batch, _ in cost_profiles.ridge_steps():
        assert not any(s == shape and f"batch {batch}," in what for s, what in listed)


def test_fitted_rows_are_marked():
    rows = {r.id: r for r in cost_validation.rows()}
    assert rows["1gpu-prefill-8192"].fit and rows["4gpu-fig9-tp4-tpot"].fit
    assert not rows["1gpu-decode-b64-ctx1024"].fit


def test_timed_tp_shards_join_the_profiles_gemm_timings(tmp_path, monkeypatch):
    """A committed `fp8_gemm.py --tp 2 --bf16-only` run (raw/*/gemm_tp_shards.json) puts its
    shapes in gemm_timed, where the step model reads a TP rank's GEMMs."""
    fp8_gemm = load_benchmark("fp8_gemm")
    assert fp8_gemm.shards(2) == {"qkv/tp2": (3072, 4096), "o/tp2": (4096, 2048),
                                  "gate_up/tp2": (14336, 4096), "down/tp2": (4096, 7168)}
    assert fp8_gemm.shards(1)["qkv"] == (6144, 4096)
    committed = [t for t in cost_profiles.timed_gemms() if t[:2] == (3072, 4096)]
    # session 43's runs: 1-256 rows (gemm_tp_shards.json), 512 and 1,024 of 512-2,048
    assert [t[2] for t in committed] == [1, 4, 16, 32, 64, 256, 512, 1024]
    monkeypatch.setattr(cost_profiles, "RAW", tmp_path)
    assert not any((n, k) == (3072, 4096) for n, k, _, _ in cost_profiles.timed_gemms())
    (tmp_path / "s43").mkdir()
    rows = [{"proj": "qkv/tp2", "n": 3072, "k": 4096, "rows": r, "bf16_us": us}
            for r, us in ((1, 8.0), (256, 12.0), (4096, 90.0))]
    (tmp_path / "s43" / "gemm_tp_shards.json").write_text(json.dumps({"rows": rows}))
    shard = [t for t in cost_profiles.timed_gemms() if t[:2] == (3072, 4096)]
    assert shard == [(3072, 4096, 1, 8e-6), (3072, 4096, 256, 1.2e-5)]  # 4,096 rows: roofline
    (tmp_path / "s43" / "both").mkdir()
    wide = [{"proj": "qkv/tp2", "n": 3072, "k": 4096, "rows": r, "bf16_us": us}
            for r, us in ((1024, 40.0), (2048, 70.0))]
    (tmp_path / "s43" / "both" / "gemm_rows_512_2048.json").write_text(json.dumps({"rows": wide}))
    shard = [t for t in cost_profiles.timed_gemms() if t[:2] == (3072, 4096)]
    assert shard[-1] == (3072, 4096, 1024, 4e-5)  # 2,048 rows: roofline (TIMED_ROWS_MAX)


def test_a_committed_lone_request_run_is_the_profiles_lone_host_work(tmp_path, monkeypatch):
    """benchmarks/lone_request_host.py's output (raw/*/lone_host.json, the last by path)
    sets the H200 profile's lone_host_s and lone_host_token_s as measured; none: 0, 0."""
    monkeypatch.setattr(cost_profiles, "RAW", tmp_path)
    assert cost_profiles.lone_host() == (0.0, 0.0, "")
    for name, per_request in (("a", 1e-3), ("b", 2e-3)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lone_host.json").write_text(json.dumps(dict(
            lone_host_s=per_request, lone_host_token_s=3e-8, commit="abc", device="H200",
            how="lone prompts", points=[[256, 1e-3]])))
    per_request, per_token, source = cost_profiles.lone_host()
    assert (per_request, per_token) == (2e-3, 3e-8) and "abc" in source
    profile = cost_profiles.base_compute()
    assert (profile.lone_host_s, profile.lone_host_token_s) == (2e-3, 3e-8)
