"""silu_and_mul against the torch path it replaces: under the Triton
interpreter on the CPU (float32, float16; it has no bfloat16) and compiled on
CUDA (bfloat16 too)."""
import pytest

from parashift.kernels import silu_mul
from parashift.layers.activation import SiluAndMul, silu_and_mul_torch
from tests.kernels.common import (assert_exact, assert_graph_replays, assert_last_bits, case_tests,
                                  cuda, randn)

# shape is [.., 2 * d]; scale 30 reaches exp's overflow; strided: x is a view
# into a wider buffer
CASES = [
    dict(shape=(1, 200)),
    dict(shape=(7, 1152)),
    dict(shape=(5, 8192)),
    dict(shape=(2, 3, 3072)),
    dict(shape=(2, 22016)),
    dict(shape=(4, 1152), strided=True),
    dict(shape=(3, 1152), scale=30.0),
]


def check(shape, strided=False, scale=3.0, dtype="float32", device="cpu"):
    x = randn(shape, dtype, device, strided=strided, scale=scale)
    out, ref = silu_mul.silu_and_mul(x), silu_and_mul_torch(x)
    if device == "cuda":
        # libdevice's expf is the CUDA expf torch calls, the division is IEEE
        # and no FMA is formed: the same roundings in the same order
        assert_exact(out, ref)
    else:
        # the interpreter's exp is numpy's, torch's on the CPU is Sleef's
        assert_last_bits(out, ref)


test_interpreted, test_cuda = case_tests(__name__, check, CASES)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_layer_runs_kernel_on_cuda_only(monkeypatch, device):
    calls = []
    monkeypatch.setattr(silu_mul, "silu_and_mul",
                        lambda x: calls.append(x) or silu_and_mul_torch(x))
    SiluAndMul()(randn((3, 64), "float32", device))
    assert len(calls) == (device == "cuda")


@cuda
def test_cuda_graph_capture():
    x = randn((4, 2 * 11008), "bfloat16", "cuda")
    assert_graph_replays(lambda: silu_mul.silu_and_mul(x), [x])
