"""The TMA FP8-weight GEMM (y^T = W x^T, the weight by tensor descriptors) against a
dequantized reference: one small tile config under the Triton interpreter, every registered
config on CUDA."""
import itertools
from dataclasses import replace
from unittest import mock

import pytest
import torch

from parashift.kernels import fp8_epilogue, fp8_gemm, fp8_gemm_tma, split_tickets
from parashift.kernels.fp8_gemm import Config
from tests.kernels.common import case_tests, cuda
from tests.kernels.test_fp8_gemm import operands

# one small tile: split 3 by tickets (several output tiles of rows and columns, a part of K
# past its end at k 64, a partial last step at k 80) for each kernel (w8bits widens as w8
# under the interpreter: tested on CUDA; w8a8 with row tiles of 16 tokens at most), and the
# persistent kernel's one part (its loop flattened across tiles)
SMALL = tuple(Config(kernel, 64, 32, 4, 2, 3, tickets=True,
                     max_block_m=16 if kernel == "tma_w8a8" else 0)
              for kernel in fp8_gemm_tma.KERNELS
              if "bits" not in kernel) + (Config("tma_w8_p", 64, 32, 4, 2),)
CASES = [dict(m=3, n=80, k=80, bias=True), dict(m=33, n=200, k=64)]
PERSISTENT_PROGRAMS = 2  # fewer than the items: each program takes several


def check(m, n, k, bias=False, dtype="float32", device="cpu", configs=SMALL):
    x, w, scale, b, expected = operands(m, n, k, bias, dtype, device)
    for config in configs:
        with mock.patch.object(fp8_gemm_tma, "num_sms", lambda device: PERSISTENT_PROGRAMS):
            actual = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
        assert actual.shape == (m, n) and actual.dtype == x.dtype
        relative = (actual.double() - expected).norm() / expected.norm()
        # FP8 activations round each to 3 mantissa bits; widened weights: 16-bit products
        assert relative < (8e-2 if "w8a8" in config.kernel else 1e-2), config
        if config.kernel.endswith("_p"):  # the same parts as a program each, summed alike
            one_each = fp8_gemm.fp8_weight_linear(x, w, scale, b, replace(
                config, kernel=config.kernel[:-2]))
            if config.tickets or config.split_k == 1:
                assert torch.equal(actual, one_each), config
            else:
                torch.testing.assert_close(actual, one_each, rtol=1e-2, atol=1e-2)
        if config.tickets and config.split_k > 1:  # the same bits again, counters back at 0
            again = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
            assert torch.equal(again, actual)
            assert not split_tickets._counters[x.device].any()


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True)


@cuda
@pytest.mark.parametrize("case", [dict(m=64, n=208, k=1024), dict(m=16, n=4096, k=512),
                                  dict(m=17, n=96, k=320, bias=True)])
def test_registered_configs_match_dequantized(case):
    configs = fp8_gemm.TMA_CONFIGS[:1] if case.get("bias") else fp8_gemm.TMA_CONFIGS
    check(**case, dtype="bfloat16", device="cuda", configs=configs)


@cuda
def test_tiles_of_fewer_tokens_match_dequantized():
    """64 rows in row tiles of 32 (split and not) against the dequantized product."""
    check(m=64, n=208, k=1024, dtype="bfloat16", device="cuda", configs=(
        Config("tma_w8a8", 64, 256, 4, 6, 1, tickets=True, max_block_m=32),
        Config("tma_w8a8", 128, 128, 4, 8, 2, tickets=True, max_block_m=32)))


@cuda
def test_persistent_kernel_sums_k_three_ways():
    """One part (the loop flattened across tiles), parts by tickets, parts added atomically,
    each against the one-program-an-item kernel (`check`)."""
    check(m=64, n=208, k=1024, dtype="bfloat16", device="cuda", configs=(
        Config("tma_w8a8_p", 128, 256, 4, 3, 1), Config("tma_w8a8_p", 128, 256, 4, 3, 4,
                                                        tickets=True),
        Config("tma_w8_p", 128, 256, 4, 3, 4)))


@cuda
def test_widening_by_integer_ops_gives_the_conversions_bits():
    """tma_w8bits' E4M3 -> bf16 by shifts and a 2^120 product against the compiler's
    conversion: every E4M3 code but NaN (subnormals, both zeros) in the weight, the same
    products, so the same output bits."""
    codes = torch.arange(256, dtype=torch.uint8, device="cuda")
    codes = codes[(codes & 0x7F) != 0x7F]  # not NaN
    w = codes[torch.randint(0, codes.numel(), (192, 512), device="cuda")].view(fp8_gemm.FP8)
    scale = torch.rand(192, 1, device="cuda") + 0.5
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    expected = x.double() @ (w.double() * scale.double()).t()
    config = Config("tma_w8bits", 128, 256, 4, 3, 4, tickets=True)
    actual = fp8_gemm.fp8_weight_linear(x, w, scale, None, config)
    assert torch.equal(actual, fp8_gemm.fp8_weight_linear(x, w, scale, None,
                                                          replace(config, kernel="tma_w8")))
    assert (actual.double() - expected).norm() / expected.norm() < 1e-2


def test_misaligned_operands_are_told_apart_and_a_misaligned_weight_refused():
    w, w_odd = torch.zeros(32, 48, dtype=fp8_gemm.FP8), torch.zeros(32, 40, dtype=fp8_gemm.FP8)
    assert fp8_gemm_tma.takes(w) and not fp8_gemm_tma.takes(w_odd)  # rows 40 bytes apart
    assert not fp8_gemm_tma.fits(torch.ones(4, 49)[:, 1:])  # a base 4 bytes past alignment
    x = torch.ones(4, 40)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fp8_gemm_tma.tma_linear(x, None, w_odd, torch.ones(32), None, x.dtype, 32, 32, 4, 1,
                                1, False)


def test_measured_only_where_enabled(monkeypatch):
    monkeypatch.delenv(fp8_gemm_tma.ENV, raising=False)
    assert set(fp8_gemm.TMA_CONFIGS) <= set(fp8_gemm.candidates(64, 4096))  # the default
    monkeypatch.setenv(fp8_gemm_tma.ENV, "0")
    assert not set(fp8_gemm.TMA_CONFIGS) & set(fp8_gemm.candidates(64, 4096))
    monkeypatch.setenv(fp8_gemm_tma.ENV, "1")
    assert set(fp8_gemm.TMA_CONFIGS) <= set(fp8_gemm.candidates(64, 4096))
    assert not set(fp8_gemm.TMA_CONFIGS) & set(fp8_gemm.candidates(4, 4096))
    monkeypatch.setenv(fp8_gemm_tma.ENV, "yes")
    with pytest.raises(ValueError, match=fp8_gemm_tma.ENV):
        fp8_gemm.candidates(64, 4096)


def test_prefetch_switch_reads_kilobytes_and_refuses_other_values(monkeypatch):
    monkeypatch.delenv(fp8_gemm_tma.PREFETCH_ENV, raising=False)
    assert fp8_gemm_tma.prefetch_bytes() == int(fp8_gemm_tma.DEFAULT_PREFETCH_KB) * 1024
    monkeypatch.setenv(fp8_gemm_tma.PREFETCH_ENV, "64")
    assert fp8_gemm_tma.prefetch_bytes() == 65536
    monkeypatch.setenv(fp8_gemm_tma.PREFETCH_ENV, "64k")
    with pytest.raises(ValueError, match=fp8_gemm_tma.PREFETCH_ENV):
        fp8_gemm_tma.prefetch_bytes()


def test_the_early_scales_switch_reads_0_or_1(monkeypatch):
    read, env = fp8_epilogue.early_scales, fp8_epilogue.EARLY_SCALES_ENV
    monkeypatch.delenv(env, raising=False)
    assert read() == (fp8_epilogue.DEFAULT_EARLY_SCALES == "1")
    monkeypatch.setenv(env, "1")
    assert read()
    assert not read(True)  # never with a bias (another FMA contraction)
    monkeypatch.setenv(env, "0")
    assert not read()
    monkeypatch.setenv(env, "yes")
    with pytest.raises(ValueError, match=env):
        read()


@cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="PDL (and so the prefetch) needs compute capability 9")
def test_launch_switches_give_the_same_bits(monkeypatch):
    """Under PDL each program pulls the start of its weight slice into L2 before its wait (a
    budget past the slice and the weight's end, clamped); the scales loaded before the main
    loop (without a bias), twice (the counters back at 0): split and not, with a bias and
    without, TMA and tl.dot kernels, the same bits as without PDL, prefetch or early scales."""
    from parashift.kernels import pdl
    x, w, scale, bias, _ = operands(64, 4096 + 64, 1024, True, "bfloat16", "cuda")
    x_fp8 = fp8_gemm.quantize_rows(x)
    configs = (Config("tma_w8a8", 64, 256, 4, 6, 1, tickets=True),
               Config("tma_w8a8", 64, 256, 4, 4, 4, tickets=True),
               Config("tma_w8a8", 256, 128, 8, 4, 1, tickets=True),
               Config("w8a8", 32, 256, 4, 4, 2, tickets=True), Config("w8", 64, 256, 4, 3))
    settings = (("0", "0", "0"), ("1", "0", "0"), ("1", "64", "0"), ("1", "4096", "1"),
                ("0", "0", "1"), ("1", "64", "1"), ("1", "64", "1"))
    for config, b in itertools.product(configs, (None, bias)):
        results = []
        for flag, kb, early in settings:
            monkeypatch.setenv(pdl.ENV, flag)
            monkeypatch.setenv(fp8_gemm_tma.PREFETCH_ENV, kb)
            monkeypatch.setenv(fp8_epilogue.EARLY_SCALES_ENV, early)
            assert pdl.pdl_enabled(x.device) == (flag == "1")
            results.append(fp8_gemm.fp8_weight_linear(x, w, scale, b, config, x_fp8))
        torch.cuda.synchronize()
        assert all(torch.equal(results[0], r) for r in results[1:]), config
        assert not split_tickets._counters[x.device].any()
