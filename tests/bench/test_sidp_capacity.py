"""benchmarks/sidp_capacity.py's arithmetic: what a SiDP rank frees for KV."""
import json
from pathlib import Path
from types import SimpleNamespace

from tests.bench.benchmark_scripts import load_benchmark

ROOT = Path(__file__).parents[2]
QWEN3_32B = SimpleNamespace(**json.loads((ROOT / "benchmarks/shapes/qwen3-32b.json").read_text()))


def test_freed_bytes_and_block_bytes_of_qwen3_32b():
    capacity = load_benchmark("sidp_capacity")
    ffn = capacity.ffn_bytes_per_rank(QWEN3_32B, tp=1)
    assert ffn == 64 * 3 * 5120 * 25600 * 2  # 50.3 GB
    # d = 2: half of it, less two slots of one layer each
    assert capacity.freed_bytes(ffn, 64, dp=2, slots=2) == ffn / 2 - ffn / 32
    # 64 layers x K and V x 16 tokens x 8 KV heads x 128 x 2 bytes
    assert capacity.block_bytes(QWEN3_32B, tp=1, block_size=16) == 64 * 2 * 16 * 8 * 128 * 2
    assert capacity.block_bytes(QWEN3_32B, tp=2, block_size=16) == 64 * 2 * 16 * 4 * 128 * 2
