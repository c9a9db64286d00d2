"""decode_throughput's --graph-variants: the settings parsed and checked, each variant's
captured graphs under its environment (restored after), the measuring order alternating
and each variant's median against the default's."""
import argparse
import os
from types import SimpleNamespace

import pytest

from tests.bench.benchmark_scripts import load_benchmark

bench = load_benchmark("decode_throughput")


def test_settings_parse_and_bad_ones_are_errors():
    assert bench.parse_settings("A_B=1,C=x=y") == {"A_B": "1", "C": "x=y"}
    for bad in ("A", "A=1,B", "=1", "A-B=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
            bench.env_settings(bad)


def test_each_variant_is_captured_under_its_settings_then_restored(monkeypatch):
    monkeypatch.setenv("PARASHIFT_X", "0")
    monkeypatch.delenv("PARASHIFT_Y", raising=False)

    class Runner:
        graphs = "startup"
        config = SimpleNamespace(mixed_step_graphs=True)

        def _capture_graphs(self):  # decode graphs only
            assert not self.config.mixed_step_graphs
            return (os.environ.get("PARASHIFT_X"), os.environ.get("PARASHIFT_Y"))

    runner = Runner()
    graphs = bench.graph_variants(runner, ["PARASHIFT_X=64", "PARASHIFT_X=1,PARASHIFT_Y=2"])
    assert graphs == {"default": "startup", "PARASHIFT_X=64": ("64", None),
                      "PARASHIFT_X=1,PARASHIFT_Y=2": ("1", "2")}
    assert os.environ["PARASHIFT_X"] == "0" and "PARASHIFT_Y" not in os.environ
    assert runner.config.mixed_step_graphs
    Runner.graphs = None
    with pytest.raises(RuntimeError, match="no CUDA graphs"):
        bench.graph_variants(Runner(), ["PARASHIFT_X=1"])


def test_rounds_alternate_and_medians_compare_with_the_default():
    assert bench.variant_order(["default", "a", "b"], 3) == [
        (0, "default"), (0, "a"), (0, "b"), (1, "b"), (1, "a"), (1, "default"),
        (2, "default"), (2, "a"), (2, "b")]
    rows = [dict(batch=64, variant=v, step_ms=ms) for v, ms in
            (("default", 5.0), ("a", 4.0), ("default", 5.4), ("a", 4.4), ("default", 9.0),
             ("a", 4.2))]
    assert bench.variant_medians(rows) == [
        dict(batch=64, variant="default", step_ms=5.4, rounds=3, default_over_this=1.0),
        dict(batch=64, variant="a", step_ms=4.2, rounds=3, default_over_this=round(5.4 / 4.2, 4))]
