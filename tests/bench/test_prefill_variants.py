"""benchmarks/prefill_variants.py's switches: each variant's environment and cuDNN thresholds
hold inside it and are put back after (the next variant runs the same engine)."""
import os
from types import SimpleNamespace

from tests.bench.benchmark_scripts import load_benchmark


def test_variants_switch_and_restore(monkeypatch):
    bench = load_benchmark("prefill_variants")
    monkeypatch.delenv("PARASHIFT_PDL", raising=False)
    monkeypatch.setenv("PARASHIFT_MOE_PREFILL", "1")
    runner = SimpleNamespace(backend=SimpleNamespace(long_prefill_tokens=4096, chunk_tokens=2048))
    with bench.variant("pdl_off", runner, None):
        assert os.environ["PARASHIFT_PDL"] == "0"
    assert "PARASHIFT_PDL" not in os.environ
    with bench.variant("moe_prefill_off", runner, None):
        assert os.environ["PARASHIFT_MOE_PREFILL"] == "0"
    assert os.environ["PARASHIFT_MOE_PREFILL"] == "1"
    with bench.variant("swept_tiles", runner, "/tmp/tiles.json"):
        assert os.environ["PARASHIFT_MOE_PREFILL_TILES"] == "/tmp/tiles.json"
    assert "PARASHIFT_MOE_PREFILL_TILES" not in os.environ
    with bench.variant("cudnn_off", runner, None):
        assert runner.backend.long_prefill_tokens > 1 << 20 and runner.backend.chunk_tokens > 1 << 20
    assert (runner.backend.long_prefill_tokens, runner.backend.chunk_tokens) == (4096, 2048)
    with bench.variant("cudnn_off", SimpleNamespace(backend=object()), None):
        pass  # a backend without cuDNN routes: nothing to switch
    files = {"old": "/tmp/old.json", "old_cudnn_off": "/tmp/old.json"}
    with bench.variant("old", runner, None, files):
        assert os.environ["PARASHIFT_MOE_PREFILL_TILES"] == "/tmp/old.json"
        assert runner.backend.long_prefill_tokens == 4096
    with bench.variant("old_cudnn_off", runner, None, files):
        assert os.environ["PARASHIFT_MOE_PREFILL_TILES"] == "/tmp/old.json"
        assert runner.backend.long_prefill_tokens > 1 << 20
    assert "PARASHIFT_MOE_PREFILL_TILES" not in os.environ
