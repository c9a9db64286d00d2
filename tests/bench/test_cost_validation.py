"""The committed H200 profiles are what benchmarks/cost_profiles.py derives from the log, the
validation table is what the model predicts from them, and every row that misses by more
than 25% says which part of the model is wrong."""
from tests.bench.benchmark_scripts import load_benchmark

cost_profiles = load_benchmark("cost_profiles")
cost_validation = load_benchmark("cost_validation")


def test_the_profiles_are_derived_by_the_script():
    assert cost_profiles.main(["--check"]) == 0


def test_the_validation_json_is_current():
    assert cost_validation.main(["--check"]) == 0


def test_every_large_miss_is_explained():
    summary = cost_validation.evaluate()["summary"]
    assert set(summary["notes"]) == set(summary["misses_over_25pct"])
    assert "not yet explained" not in summary["notes"].values()


def test_fitted_rows_are_marked():
    rows = {r.id: r for r in cost_validation.rows()}
    assert rows["1gpu-prefill-8192"].fit and rows["4gpu-fig9-tp4-tpot"].fit
    assert not rows["1gpu-decode-b64-ctx1024"].fit
