import argparse
import json

from tests.bench.benchmark_scripts import ROOT, load_benchmark


def test_projections_are_one_ranks_shards():
    gemm_backends = load_benchmark("gemm_backends")
    with open(ROOT / "benchmarks/shapes/llama-3.1-8b.json") as f:
        cfg = argparse.Namespace(**json.load(f))
    assert gemm_backends.projections(cfg, 1) == {
        "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
        "down": (4096, 14336), "head": (128256, 4096)}
    # column-parallel shards N, row-parallel K
    assert gemm_backends.projections(cfg, 2) == {
        "qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096),
        "down": (4096, 7168), "head": (64128, 4096)}
