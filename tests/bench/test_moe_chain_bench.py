"""benchmarks/moe_chain.py's floor on the CPU: each layer's distinct routed experts and its
router, each layer's router on its own rows as the chain routes them."""
import torch

from tests.bench.benchmark_scripts import load_benchmark

CFG = {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}


def test_floor_counts_each_layer_s_routed_experts_once():
    bench = load_benchmark("moe_chain")
    router = torch.zeros(4, 8)
    router[1, 0], router[2, 0] = 10.0, 5.0  # e0 routes to experts 1 and 2
    router[3, 1], router[0, 1] = 10.0, 5.0  # e1 to 3 and 0
    gate_up, down = torch.zeros(4, 6, 8), torch.zeros(4, 8, 3)
    e0, e1 = torch.eye(8)[:2]
    routes = [torch.stack([e0, e0]), torch.stack([e0, e1])]  # 2 experts, then 4
    per_expert, router_bytes = (6 * 8 + 8 * 3) * 4, 4 * 8 * 4
    floor = bench.floor_us(routes, [(router, gate_up, down)] * 2, CFG, 1e6)
    assert floor == (2 * per_expert + 4 * per_expert) / 2 + router_bytes
