"""silu_and_mul against the torch path it replaces: under the Triton
interpreter on the CPU (float32, float16; it has no bfloat16) and compiled on
CUDA (bfloat16 too). The FP8 variant against the kernels it stands for (the plain
kernel, then `fp8_gemm.quantize_rows`), bit for bit."""
import pytest

from parashift.kernels import fp8_gemm, silu_mul, split_tickets
from parashift.layers.activation import SiluAndMul, silu_and_mul_torch
from tests.kernels.common import (as_bytes, assert_exact, assert_fp8_rows, assert_graph_replays,
                                  assert_last_bits, case_tests, cuda, randn)

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

# blocks: [gate_i | up_i] blocks, as a layer whose rows Shift reordered holds them; d = 14336
# (the 8B layer's) and 2 x 8200 take several programs a row (split, as below SPLIT_ROWS rows)
# and several steps of the row loops (split=False, as from SPLIT_ROWS rows), the last partly
# masked
FP8_CASES = [
    dict(shape=(1, 200)),
    dict(shape=(7, 1152)),
    dict(shape=(3, 2 * 14336)),
    dict(shape=(3, 2 * 14336), split=False),
    dict(shape=(2, 3, 3072)),
    dict(shape=(4, 1152), strided=True),
    dict(shape=(3, 1152), scale=30.0),
    dict(shape=(5, 2 * 2 * 96), blocks=2),
    dict(shape=(3, 4 * 2 * 40), blocks=4),
    dict(shape=(2, 2 * 2 * 8200), blocks=2),
    dict(shape=(2, 2 * 2 * 8200), blocks=2, split=False),
]


def check_fp8(shape, blocks=1, strided=False, scale=3.0, split=None, dtype="float32",
              device="cpu"):
    x = randn(shape, dtype, device, strided=strided, scale=scale)
    out, q, scales = silu_mul.silu_and_mul_fp8(x, blocks, split)
    assert_exact(out, silu_mul.silu_and_mul(x.unflatten(-1, (blocks, -1))).flatten(-2))
    assert_fp8_rows(q, scales, fp8_gemm.quantize_rows(out.reshape(-1, out.shape[-1])), out)
    if split is None:  # split: the row counters are back at 0 for the next launch
        assert not split_tickets._counters[x.device].any()


test_fp8_interpreted, test_fp8_cuda = case_tests(__name__, check_fp8, FP8_CASES)


@cuda
def test_fp8_rows_split_over_programs_again_and_again():
    """The row's last program reads what the others stored (behind their tickets): launch
    after launch, at decode's row counts and up to the counters' (beyond: a program a row),
    the pair's bytes."""
    cases = [(rows, None) for rows in (1, 2, 7, 16, 64, 131, 300)] * 8
    cases += [(silu_mul.MAX_SPLIT_ROWS, True), (silu_mul.MAX_SPLIT_ROWS + 1, True)]
    for i, (rows, split) in enumerate(cases):
        x = randn((rows, 2 * 14336), "bfloat16", "cuda", seed=i)
        out, q, scales = silu_mul.silu_and_mul_fp8(x, split=split)
        assert_exact(out, silu_mul.silu_and_mul(x))
        assert_fp8_rows(q, scales, fp8_gemm.quantize_rows(out), out)


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
    assert_graph_replays(lambda: as_bytes(silu_mul.silu_and_mul_fp8(x)), [x])


@cuda
@pytest.mark.parametrize("attr, value", [("SPLIT_BLOCK", 1024), ("SPLIT_BLOCK", 4096),
                                         ("SPLIT_WARPS", 4), ("SPLIT_WARPS", 16)])
def test_fp8_split_columns_and_warps_give_the_same_bits(monkeypatch, attr, value):
    """The 8B's 64 rows split over other part widths or warps (benchmarks' patch variants):
    the row's largest magnitude is exact in any grouping, so every output is the same."""
    x = randn((64, 2 * 14336), "bfloat16", "cuda", scale=3.0)
    before = silu_mul.silu_and_mul_fp8(x, split=True)
    monkeypatch.setattr(silu_mul, attr, value)
    after = silu_mul.silu_and_mul_fp8(x, split=True)
    assert_exact(as_bytes(after), as_bytes(before))
    assert not split_tickets._counters[x.device].any()
