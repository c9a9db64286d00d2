"""benchmarks/moe_small.py's floor: the distinct experts a call routes to, their bytes (FP8
scales included) at the given bandwidth, averaged over the calls."""
import torch

from tests.bench.benchmark_scripts import load_benchmark


def test_floor_counts_each_routed_expert_once():
    bench = load_benchmark("moe_small")
    gate_up, down = torch.zeros(4, 6, 8, dtype=torch.bfloat16), torch.zeros(4, 8, 3,
                                                                          dtype=torch.bfloat16)
    per_expert = (6 * 8 + 8 * 3) * 2
    calls = [(None, None, torch.tensor([[0, 1], [1, 2]])),  # 3 distinct experts
             (None, None, torch.tensor([[3, 3], [3, 3]]))]  # 1
    assert bench.floor_us(calls, (gate_up, down, None), 1e6) == 2 * per_expert
    scales = (torch.zeros(4, 6, 1), torch.zeros(4, 8, 1))
    fp8 = (gate_up.to(torch.float8_e4m3fn), down.to(torch.float8_e4m3fn), scales)
    assert bench.floor_us(calls, fp8, 1e6) == 2 * (per_expert // 2 + (6 + 8) * 4)
