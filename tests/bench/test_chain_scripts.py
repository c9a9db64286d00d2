"""The decode-chain variant scripts (decode_chain.py, l2_prefetch_chain.py,
fp8_chain_variants.py) on the CPU: their options and a dry run of their rows through
pdl_chain's shared main, the GPU parts (layers, graphs, replays) faked."""
import json

import pytest
import torch

from benchmarks import pdl_chain
from parashift.kernels import gemm_timing
from tests.bench.benchmark_scripts import load_benchmark

RUNS = {  # script: (its options, the weights its rows have, the keys of a row)
    "decode_chain": (["--weights", "bf16", "--batch-sizes", "1", "2", "--variants", "graph",
                      "chain_silu_gate_up"], ["bf16", "bf16"],
                     {"weights", "batch", "layers", "variants",
                      "speedup_chain_silu_gate_up_vs_graph", "max_abs_diff_vs_graph", "setup_s",
                      "chosen"}),
    "l2_prefetch_chain": (["--weights", "fp8", "bf16", "--variants", "off",
                           "PARASHIFT_L2_PREFETCH_MB=qkv:16"], ["fp8", "bf16"],
                          {"weights", "batch", "layers", "variants", "same_bits", "chosen"}),
    "fp8_chain_variants": (["--batch-sizes", "1", "64", "--variants", "default",
                            "PARASHIFT_CHAIN_TEST=1"], [None, None],
                           {"batch", "layers", "variants", "same_bits", "chosen"}),
}


def fake_gpu(monkeypatch):
    """Layers of two-element weights, a step giving zeros, graphs that are the run itself and
    replays taking 1 ms, then 2 ms, then 3 ms... in call order."""
    def step_args(count, fp8, batch, context, max_model_len):
        weight = ((torch.zeros(1, 2, dtype=torch.uint8), torch.ones(1, 1)) if fp8
                  else torch.zeros(1, 2, dtype=torch.bfloat16))
        layers = [pdl_chain.Layer(dict.fromkeys(pdl_chain.SHAPES, weight), (None, None), None,
                                  None) for _ in range(count)]
        return (torch.zeros(batch, 4), None, layers, None, None, None, None)

    replays = iter(range(1, 1000))
    monkeypatch.setattr(pdl_chain, "step_args", step_args)
    monkeypatch.setattr(pdl_chain, "step", lambda x, *args, **kw: (torch.zeros_like(x), None))
    monkeypatch.setattr(pdl_chain, "capture", lambda run: run())
    monkeypatch.setattr(pdl_chain, "replay_ms", lambda graph: float(next(replays)))
    monkeypatch.setattr(pdl_chain, "copy_bandwidth", lambda device: 4e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "fake")
    monkeypatch.delenv(gemm_timing.TIMING_ENV, raising=False)  # decode_chain sets it


@pytest.mark.parametrize("name", RUNS)
def test_a_dry_run_writes_a_row_per_weights_and_batch(name, monkeypatch, tmp_path):
    options, weights, keys = RUNS[name]
    fake_gpu(monkeypatch)
    output = tmp_path / "rows.json"
    monkeypatch.setattr("sys.argv", [name, *options, "--layers", "2", "--repeats", "3",
                                     "--output", str(output)])
    load_benchmark(name).main()
    written = json.loads(output.read_text())
    assert written["device"] == "fake" and written["copy_bandwidth_tb_s"] == 4.0
    rows = written["rows"]
    assert [row.get("weights") for row in rows] == weights
    assert all(set(row) == keys and row["layers"] == 2 for row in rows)
    first, second = (row["variants"] for row in rows)
    assert list(first) == options[options.index("--variants") + 1:]
    # three rounds of two replays, 1..6 ms, 2 layers: medians of 1, 3, 5 and 2, 4, 6; where
    # every second round goes in reverse (fp8_chain_variants), of 1, 4, 5 and 2, 3, 6
    medians = [2000.0, 1500.0] if name == "fp8_chain_variants" else [1500.0, 2000.0]
    assert [v["us_per_layer"] for v in first.values()] == medians
    assert [v["us_per_layer"] for v in second.values()] == [3000 + m for m in medians]


@pytest.mark.parametrize("name, options", [("decode_chain", ["--variants", "nope"]),
                                           ("l2_prefetch_chain", ["--variants", "placement=x"]),
                                           ("fp8_chain_variants", ["--weights", "fp8"])])
def test_an_unknown_option_or_variant_is_an_error(name, options, monkeypatch):
    monkeypatch.setattr("sys.argv", [name, *options])
    with pytest.raises(SystemExit) as exit_:
        load_benchmark(name).main()
    assert exit_.value.code == 2
