"""Decode-sized expert batches (16-row blocks) through the prefill path's fused kernels
(kernels/moe_decode.py): the dispatch and its switch, the tiles and their override; on CUDA a
64-token batch of 128 experts at top-8 against the unfused path and the torch reference."""
import pytest
import torch

from parashift.kernels import fused_moe, moe_decode
from tests.kernels.common import cuda_tests
from tests.kernels.test_fused_moe import TOLERANCE, inputs, unfused_decode
from tests.kernels.test_moe_small import rounded_reference


class Unfused(Exception):
    pass


@pytest.mark.parametrize("flag, fused", [("1", True), ("0", False), (None, True)])
def test_decode_batches_take_the_fused_kernels_unless_switched_off(monkeypatch, flag, fused):
    if flag is None:
        monkeypatch.delenv(moe_decode.ENV, raising=False)
    else:
        monkeypatch.setenv(moe_decode.ENV, flag)
    calls = []
    monkeypatch.setattr(fused_moe, "prefill_experts",
                        lambda *args, **kwargs: calls.append(args[-1]) or "fused")
    def unfused(*args, **kwargs):
        raise Unfused
    monkeypatch.setattr(fused_moe, "sort_pairs", unfused)  # the unfused path's first launch
    args = inputs(tokens=4, experts=8, top_k=2, hidden=32, inter=16)
    try:
        out = fused_moe.grouped_experts(*args)
    except Unfused:
        out = "unfused"
    assert (out == "fused") == fused
    if fused:
        assert calls[0]["block_m"] == fused_moe.BLOCK_M == moe_decode.BLOCK_M


def test_tiles_fit_small_dims_and_take_the_override(monkeypatch):
    monkeypatch.delenv(moe_decode.TILES_ENV, raising=False)
    assert moe_decode.tiles_for(768, 2048) == {"block_m": 16, "gate_up": moe_decode.GATE_UP_TILE,
                                               "down": moe_decode.DOWN_TILE}
    small = moe_decode.tiles_for(16, 32)
    assert small["gate_up"][:2] == (16, 32) and small["down"][:2] == (32, 16)
    monkeypatch.setenv(moe_decode.TILES_ENV, "64,64,4,3,128,64,4,3")
    assert moe_decode.tiles_for(768, 2048) == {"block_m": 16, "gate_up": (64, 64, 4, 3),
                                               "down": (128, 64, 4, 3)}
    monkeypatch.setenv(moe_decode.TILES_ENV, "64,60,4,3,128,64,4,3")
    with pytest.raises(ValueError):
        moe_decode.tiles_for(768, 2048)


def check(dtype, device, **case):
    """The fused kernels against the unfused path and the experts rounded as both round
    them, the k pairs summed in fp32 (expert_outputs rounds each add: at top-8 in bf16 a
    session-44 H200 run of hidden 256 put 107 of 16,384 outputs past its tolerance, near
    zero where the pairs' ~20s cancel)."""
    args = inputs(**case, dtype=dtype, device=device)
    out = fused_moe.grouped_experts(*args)
    with unfused_decode():
        unfused = fused_moe.grouped_experts(*args)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, unfused, atol=tol, rtol=tol)
    torch.testing.assert_close(out, rounded_reference(*args), atol=tol, rtol=tol)


# Qwen3-30B-A3B's routing at 64 tokens (512 pairs over 128 experts), narrower experts
test_cuda_decode_batch = cuda_tests(check, [dict(tokens=64, experts=128, top_k=8, hidden=128,
                                                 inter=64)])
