"""benchmarks/moe_chain.py's floor on the CPU: each layer's distinct routed experts and its
router, routed as the chain routes them (each layer on the one before's output)."""
import torch

from tests.bench.benchmark_scripts import load_benchmark

CFG = {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}


def test_floor_counts_each_layer_s_routed_experts_once():
    bench = load_benchmark("moe_chain")
    router = torch.zeros(4, 8)
    router[1, 0] = router[2, 1] = 10.0  # x = e0 routes to experts 1 and 2
    router[2, 0] = 5.0
    gate_up, down = torch.zeros(4, 6, 8), torch.zeros(4, 8, 3)
    x = torch.zeros(2, 8)
    x[:, 0] = 1.0
    seen = []

    def experts(x, w, ids, gate_up, down):  # the next layer's input: e1, routed to 2 and 0
        seen.append(ids.tolist())
        out = torch.zeros_like(x)
        out[:, 1] = 1.0
        return out
    layers = [(router, gate_up, down), (router.clone(), gate_up, down)]
    layers[1][0][0, 1] = 5.0
    per_expert, router_bytes = (6 * 8 + 8 * 3) * 4, 4 * 8 * 4
    floor = bench.floor_us(experts, x, layers, CFG, 1e6)
    assert sorted(seen[0][0]) == [1, 2] and sorted(seen[1][0]) == [0, 2]
    assert floor == (2 * per_expert + router_bytes)
