"""The row argmax (kernels/argmax.py) against torch.argmax, index for index: under the Triton
interpreter on the CPU and compiled on CUDA; ties across and within parts (the first index
wins), NaN (counted largest), a row of -inf, odd widths."""
import torch

from parashift.kernels import argmax, split_tickets
from parashift.layers.sampler import Sampler
from tests.kernels.common import assert_exact, case_tests, cuda, randn

CASES = [dict(rows=4, columns=700, block=256)]


def check(rows, columns, block=argmax.BLOCK, dtype="float32", device="cpu"):
    logits = randn((rows, columns), dtype, device, scale=3.0)
    top = logits.max()
    logits[0, [columns - 1, 100, block + 3]] = top + 1  # a tie across parts: 100 wins
    if rows > 1:
        logits[1, [block + 1, block]] = top + 1  # a tie within a part
        logits[1, columns - 2] = float("nan")  # NaN counts largest
        logits[2] = -float("inf")  # the first column
    assert_exact(argmax.argmax(logits, block), logits.argmax(dim=-1))
    assert not split_tickets._counters[logits.device].any()  # every counter back at 0


test_interpreted, test_cuda = case_tests(__name__, check, CASES)


def test_on_by_default(monkeypatch):
    monkeypatch.delenv(argmax.ENV, raising=False)
    assert argmax.enabled()
    monkeypatch.setenv(argmax.ENV, "0")
    assert not argmax.enabled()


def test_the_sampler_warms_it_up_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(argmax, "argmax", lambda logits, *args: calls.append(logits.shape))
    Sampler("cpu").warm_up(1000, torch.bfloat16)
    assert calls == []
    if torch.cuda.is_available():
        Sampler("cuda").warm_up(1000, torch.bfloat16)
        assert calls == [(1, 1000)]


@cuda
def test_the_sampler_takes_it_on_cuda(monkeypatch):
    monkeypatch.setenv(argmax.ENV, "1")
    calls = []
    kernel = argmax.argmax
    monkeypatch.setattr(argmax, "argmax", lambda *args: calls.append(1) or kernel(*args))
    logits = randn((64, 128256), "bfloat16", "cuda", scale=3.0)
    assert_exact(Sampler.argmax(logits).token_ids, logits.argmax(dim=-1))
    assert calls == [1]
    check(4, 128256, dtype="bfloat16", device="cuda")
