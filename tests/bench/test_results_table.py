"""docs/results.md and README.md's results table are what benchmarks/results_table.py makes from
benchmarks/results/*.json, and every claim record there is whole."""
import copy

import pytest

from tests.bench.benchmark_scripts import load_benchmark

results_table = load_benchmark("results_table")


@pytest.fixture(scope="module")
def loaded():
    return results_table.load_groups()


def test_every_claim_record_is_whole(loaded):
    groups, _ = loaded
    assert groups, "no claim groups in benchmarks/results/"
    assert results_table.all_problems(groups) == []


def test_raw_outputs_without_claims_are_skipped_not_lost(loaded):
    _, skipped = loaded
    assert "sidp_probe_h200.json" in skipped


def test_docs_results_md_is_generated_from_the_json(loaded):
    groups, skipped = loaded
    wanted = results_table.render_results(groups, skipped)
    assert results_table.RESULTS_MD.read_text() == wanted, (
        "docs/results.md differs from benchmarks/results/*.json: "
        "run python3 benchmarks/results_table.py")


def test_readme_table_is_generated_from_the_json(loaded):
    groups, _ = loaded
    readme = results_table.README.read_text()
    wanted = results_table.with_readme_table(readme, results_table.render_readme_table(groups))
    assert readme == wanted, (
        "README.md's results table differs: run python3 benchmarks/results_table.py")


def test_the_check_passes(loaded):
    assert results_table.main(["--check"]) == 0


def a_record(loaded) -> dict:
    groups, _ = loaded
    with_baseline = (r for g in groups for r in g["claims"] if r.get("baseline") is not None)
    return copy.deepcopy(next(with_baseline))


@pytest.mark.parametrize("field", [*results_table.REQUIRED, *results_table.WITH_BASELINE])
def test_a_record_missing_a_field_is_refused(loaded, field):
    record = a_record(loaded)
    del record[field]
    assert any(field in problem for problem in results_table.problems(record))


def test_a_ratio_that_is_not_figure_over_baseline_is_refused(loaded):
    record = a_record(loaded)
    record["ratio"] = round(record["ratio"] * 1.1, 3)
    assert any("ratio" in problem for problem in results_table.problems(record))


def test_a_record_without_baseline_needs_a_floor(loaded):
    record = a_record(loaded)
    for field in ("baseline", "baseline_plan", "ratio", "baseline_other_call", "floor"):
        record.pop(field, None)
    assert any("floor" in problem for problem in results_table.problems(record))


def test_a_record_needs_a_commit_or_a_session(loaded):
    record = a_record(loaded)
    record.pop("commit", None)
    record.pop("session", None)
    assert any("commit" in problem for problem in results_table.problems(record))


def test_the_verdict_reads_the_metric_direction():
    faster = {"baseline": 10.0, "figure": 8.0, "ratio": 0.8, "better": "lower"}
    assert results_table.verdict(faster) == "better"
    assert results_table.verdict(faster | {"better": "higher"}) == "worse"
    close = {"baseline": 10.0, "figure": 10.1, "ratio": 1.01, "better": "lower"}
    assert results_table.verdict(close) == "on par"
