"""The MoE layer on one process: routing, the expert-sorted computation against a dense
one (every expert on every token), and the TP and EP shards of the experts loaded from
per-expert checkpoint tensors (fake groups, no communication) summing to the whole."""
import pytest
import torch
import torch.nn.functional as F

from parashift.context import StepContext, use_context, use_state
from parashift.layers.fused_moe import FusedExperts, FusedMoE, expert_outputs, route
from tests.helpers.fake_groups import FakeGroup, tp_state
from tests.kernels.common import cuda

E, H, I, K, T = 6, 16, 12, 2, 10


def checkpoint(seed: int = 0) -> dict[tuple[int, str], torch.Tensor]:
    """One expert's gate, up and down as a checkpoint holds them."""
    g = torch.Generator().manual_seed(seed)
    return {(e, name): torch.randn(shape, generator=g)
            for e in range(E) for name, shape in
            (("gate", (I, H)), ("up", (I, H)), ("down", (H, I)))}


def dense_reference(x, weights, ids, ckpt) -> torch.Tensor:
    """Every expert on every token, weighted by the routing (zero where not chosen)."""
    dense = torch.zeros(x.shape[0], E).scatter(1, ids, weights)
    out = torch.zeros_like(x)
    for e in range(E):
        h = F.silu(x @ ckpt[e, "gate"].T) * (x @ ckpt[e, "up"].T)
        out += dense[:, e:e + 1] * (h @ ckpt[e, "down"].T)
    return out


def loaded_experts(ckpt, mode: str, size: int = 1, rank: int = 0,
                   reduction_chunks: int | None = None) -> FusedExperts:
    with use_state(tp_state(size, rank), moe_parallel=mode, reduction_chunks=reduction_chunks):
        experts = FusedExperts(E, H, I, mode)
    for (e, name), w in ckpt.items():
        param = experts.down_proj if name == "down" else experts.gate_up_proj
        half = {"gate": 0, "up": 1, "down": None}[name]
        param.weight_loader(param, w, (e, half))
    return experts


def routing(x: torch.Tensor, crowd: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-2 routing; `crowd` sends every token to experts 1 and 4 only (the rest idle)."""
    logits = torch.randn(x.shape[0], E, generator=torch.Generator().manual_seed(3))
    if crowd:
        logits[:, [1, 4]] += 100.0
    return route(logits, K, renormalize=True)


def test_route_renormalizes_only_when_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = route(logits, 2, renormalize=False)
    probs = logits.softmax(-1)
    assert ids.tolist() == [[0, 1]]
    assert torch.allclose(weights, probs[:, :2])
    weights, _ = route(logits, 2, renormalize=True)
    assert torch.allclose(weights, probs[:, :2] / probs[:, :2].sum())


@pytest.mark.parametrize("crowd", [False, True])
def test_sorted_experts_match_dense(crowd):
    ckpt, x = checkpoint(), torch.randn(T, H)
    weights, ids = routing(x, crowd)
    experts = loaded_experts(ckpt, "tp")
    ours = expert_outputs(x, weights, ids, experts.gate_up_proj, experts.down_proj)
    assert torch.allclose(ours, dense_reference(x, weights, ids, ckpt), atol=1e-4)


@pytest.mark.parametrize("mode,size", [("tp", 2), ("tp", 3), ("ep", 2), ("ep", 3)])
def test_shards_sum_to_the_whole(mode, size):
    """TP: each rank 1/size of every expert's width; EP: E/size whole experts each. The
    ranks' partial outputs sum to the single-device output, idle experts included."""
    ckpt, x = checkpoint(), torch.randn(T, H)
    weights, ids = routing(x, crowd=True)
    total = torch.zeros_like(x)
    for rank in range(size):
        experts = loaded_experts(ckpt, mode, size, rank)
        local = E // size if mode == "ep" else E
        width = I if mode == "ep" else I // size
        assert experts.gate_up_proj.shape == (local, 2 * width, H)
        with use_context(StepContext(tp_state(size, rank))):
            total += experts(x, weights, ids)
    assert torch.allclose(total, dense_reference(x, weights, ids, ckpt), atol=1e-4)


def test_stacked_checkpoint_tensors_load_like_per_expert_ones():
    """GGUF stores each matrix of all experts stacked (expert id None)."""
    ckpt = checkpoint()
    per_expert = loaded_experts(ckpt, "tp", 2, 1)
    with use_state(tp_state(2, 1)):
        stacked = FusedExperts(E, H, I, "tp")
    for name, half in (("gate", 0), ("up", 1), ("down", None)):
        param = stacked.down_proj if name == "down" else stacked.gate_up_proj
        param.weight_loader(param, torch.stack([ckpt[e, name] for e in range(E)]), (None, half))
    assert torch.equal(stacked.gate_up_proj, per_expert.gate_up_proj)
    assert torch.equal(stacked.down_proj, per_expert.down_proj)


def test_narrowed_layout_computes_its_slice():
    """A shift or merged plan's 1/f slice of the TP shard: the slices sum to the shard."""
    ckpt, x = checkpoint(), torch.randn(T, H)
    weights, ids = routing(x, crowd=False)
    experts = loaded_experts(ckpt, "tp")
    whole = expert_outputs(x, weights, ids, experts.gate_up_proj, experts.down_proj)
    parts = torch.zeros_like(x)
    for position in range(3):
        experts.make_narrowed_layout(f"n{position}", 3, position)
        with use_context(StepContext(tp_state(1, 0), weights=f"n{position}")):
            parts += experts(x, weights, ids)
    assert torch.allclose(parts, whole, atol=1e-4)


@pytest.mark.parametrize("deterministic", [False, True])
def test_merged_plan_splits_the_replicas_experts(deterministic):
    """EP: replicas of all E experts merge into a TP=2 group; each rank computes the experts
    of its slice (its position's half), out of the weights it loaded, and the partial sums
    (added by the group's all-reduce) give the replica's output. Shift's plan, whose group
    is the EP group, keeps every expert."""
    from dataclasses import replace
    ckpt, x = checkpoint(), torch.randn(T, H)
    weights, ids = routing(x, crowd=False)
    chunks = 2 if deterministic else None
    experts = loaded_experts(ckpt, "ep", reduction_chunks=chunks)  # a replica holds them all
    whole = experts(x, weights, ids)
    merged = replace(tp_state(2, 0), ep=FakeGroup((0,), 0))  # TP over both replicas
    total = torch.zeros_like(x)
    for position in range(2):
        experts.make_narrowed_layout(f"merge{position}", 2, position)
        assert experts.layout_first_expert[f"merge{position}"] == 3 * position
        with use_context(StepContext(merged, weights=f"merge{position}")):
            total += experts(x, weights, ids)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-5)
    with use_context(StepContext(tp_state(1, 0), weights="merge1")):  # group = EP group
        assert experts.merged_layout() is None


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok = 7"):
        FusedMoE(H, E, 7, I, renormalize=True)
    with pytest.raises(ValueError, match="moe_parallel"):
        FusedExperts(E, H, I, "dp")


@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_deterministic_experts_match_dense_and_ignore_the_batch(mode):
    """Deterministic mode (I = 12 in 4 chunks): the dense result, and each token's output
    bit-identical alone and among the others."""
    ckpt, x = checkpoint(), torch.randn(T, H)
    weights, ids = routing(x, crowd=False)
    experts = loaded_experts(ckpt, mode, reduction_chunks=4)
    with use_state(tp_state(1, 0), moe_parallel=mode):
        batch = experts(x, weights, ids)
        alone = [experts(x[t:t + 1], weights[t:t + 1], ids[t:t + 1]) for t in range(T)]
    assert torch.allclose(batch, dense_reference(x, weights, ids, ckpt), atol=1e-4)
    assert torch.equal(torch.cat(alone), batch)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_router_fuses_gate_and_routing_at_cuda_decode_rows(monkeypatch, device):
    """Router.route takes kernels/moe_router.py on CUDA at one row, the gate then the
    routing elsewhere; the same experts and weights (integer inputs: exact logits)."""
    from parashift.kernels import moe_router
    from parashift.layers.fused_moe import Router
    monkeypatch.setattr(moe_router, "ENABLED", True)
    calls = []
    fused = moe_router.route_from_hidden
    monkeypatch.setattr(moe_router, "route_from_hidden",
                        lambda *a: calls.append(a[0].shape[0]) or fused(*a))
    gate = Router(64, 16).to(device)
    gen = torch.Generator().manual_seed(0)
    gate.weight.copy_(torch.randint(-1, 2, (16, 64), generator=gen))
    for rows in (1, 2, 4):
        x = torch.randint(-2, 3, (rows, 64), generator=gen).float().to(device)
        weights, ids = gate.route(x, 4, True)
        ref_weights, ref_ids = route(gate(x), 4, True)
        assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    assert calls == ([1] if device == "cuda" else [])
