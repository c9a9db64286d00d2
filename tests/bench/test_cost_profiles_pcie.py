"""The committed PCIe-like link profiles are what benchmarks/cost_profiles_pcie.py fits to the
logged runs, and the validation marks the one row they were fitted to."""
from tests.bench.benchmark_scripts import load_benchmark

cost_profiles_pcie = load_benchmark("cost_profiles_pcie")
cost_validation = load_benchmark("cost_validation")


def test_the_pcie_like_profiles_are_derived_by_the_script():
    assert cost_profiles_pcie.main(["--check"]) == 0


def test_only_the_fitted_pcie_like_row_is_marked_fit():
    rows = [r for r in cost_validation.rows() if r.group == "PCIe-like"]
    assert [r.id for r in rows if r.fit] == ["2gpu-pcie-summarize-tp2-x2i65"]
    shape, workload, plan, seconds = cost_profiles_pcie.FIT_ROWS["bytes_per_s"]
    fitted = next(r for r in rows if r.fit)
    assert (fitted.shape, fitted.measured, plan) == (shape, seconds, "tp2")
    assert workload in fitted.what and len(rows) == 15
