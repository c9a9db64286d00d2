"""The one-launch router (gate GEMV + routing) against the two launches it replaces,
moe_routing.route of the gate's logits: the same expert ids (ties: the lowest id first) and
weights bit for bit. The activations and weights are small integers, so every order of the
GEMV's fp32 sum gives the same logits (ties among them are common: the tie order is tested)."""
import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import moe_router, moe_routing
from tests.kernels.common import assert_exact, case_tests, cuda, cuda_tests

# rows (1-4: decode), experts (not a power of two: masked), top-k, hidden (odd: masked K)
CASES = [dict(tokens=3, experts=12, top_k=4, hidden=40, renormalize=True)]
CUDA_CASES = [dict(tokens=1, experts=128, top_k=8, hidden=2048, renormalize=True),
              dict(tokens=4, experts=128, top_k=8, hidden=2048, renormalize=False),
              dict(tokens=2, experts=60, top_k=4, hidden=2050, renormalize=True),
              dict(tokens=3, experts=256, top_k=8, hidden=7168, renormalize=True, block_e=4)]


def integer_inputs(tokens, experts, hidden, dtype, device):
    gen = torch.Generator().manual_seed(tokens * 1000 + experts)
    x = torch.randint(-2, 3, (tokens, hidden), generator=gen)
    weight = torch.randint(-1, 2, (experts, hidden), generator=gen)
    # a strided weight: the router's rows inside a wider buffer
    wide = torch.zeros(experts, hidden + 8, dtype=getattr(torch, dtype))
    wide[:, :hidden] = weight
    return x.to(device, getattr(torch, dtype)), wide.to(device)[:, :hidden]


def check_router(tokens, experts, top_k, hidden, renormalize, block_e=1, dtype="float32",
                 device="cpu"):
    x, weight = integer_inputs(tokens, experts, hidden, dtype, device)
    weights, ids = moe_router.route_from_hidden(x, weight, top_k, renormalize,
                                                block_e=block_e)
    ref_weights, ref_ids = moe_routing.route(F.linear(x, weight), top_k, renormalize)
    assert_exact(ids, ref_ids)
    assert_exact(weights, ref_weights)
    again = moe_router.route_from_hidden(x, weight, top_k, renormalize, block_e=block_e)
    assert_exact(again[1], ids)  # the ticket counter was left at 0
    if device == "cuda":  # one warp a program (PARASHIFT_MOE_ROUTER_WARPS=1)
        one_warp = moe_router.route_from_hidden(x, weight, top_k, renormalize,
                                                block_e=block_e, num_warps=1)
        assert_exact(one_warp[1], ref_ids)
        assert_exact(one_warp[0], ref_weights)


# uses_dot: the GPU image's Triton 3.6 interpreter fails on the routing code ("only
# 0-dimensional arrays", as on moe_routing's kernels); CI's 3.9 runs it
test_interpreted, _ = case_tests(__name__, check_router, CASES, uses_dot=True)
test_cuda = cuda_tests(check_router, CUDA_CASES)


@cuda
def test_cuda_graph_replays_new_hidden_states():
    from tests.kernels.common import assert_graph_replays
    x, weight = integer_inputs(1, 128, 2048, "bfloat16", "cuda")
    assert_graph_replays(lambda: torch.cat(
        [t.float() for t in moe_router.route_from_hidden(x, weight, 8, True)], 1), [x])


def test_fits_one_row_of_the_weights_dtype(monkeypatch):
    monkeypatch.setattr(moe_router, "ENABLED", True)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    weight = torch.zeros(128, 64, dtype=torch.bfloat16)
    assert moe_router.fits(x, weight, 8)
    assert not moe_router.fits(torch.zeros(2, 64, dtype=torch.bfloat16), weight, 8)
    assert not moe_router.fits(x, weight.to(torch.float8_e4m3fn), 8)
    assert not moe_router.fits(x, weight, 6)  # k not a power of two
    with pytest.raises(ValueError, match="route_from_hidden takes x"):
        moe_router.route_from_hidden(torch.zeros(5, 64), weight.float(), 8, True)


def test_warps_from_the_environment(monkeypatch):
    monkeypatch.setenv(moe_router.WARPS_ENV, "1")
    assert moe_router.default_warps() == 1
    monkeypatch.setenv(moe_router.WARPS_ENV, "3")
    with pytest.raises(ValueError, match=moe_router.WARPS_ENV):
        moe_router.default_warps()
