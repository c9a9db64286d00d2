"""The FP8-weight GEMM against a dequantized reference (CUDA), and which configs a shape
measures (CPU). The GEMV it runs at 1-4 rows is tested on its own in test_fp8_gemv.py."""
import pytest
import torch

from parashift.kernels import fp8_gemm, fp8_gemm_tma, gemm_timing, split_tickets
from parashift.kernels.fp8_gemm import Config
from tests.kernels.common import case_tests, cuda, randn


def quantized(n, k, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5
    scale = w.abs().amax(1, keepdim=True) / fp8_gemm.FP8_MAX
    return (w / scale).to(fp8_gemm.FP8), scale


@cuda
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64])
@pytest.mark.parametrize("n,k", [(96, 256), (200, 320), (64, 1000)])
@pytest.mark.parametrize("config", [c for c in fp8_gemm.CONFIGS if c.block_n <= 32])
@pytest.mark.parametrize("bias", [False, True])
def test_triton_kernel_matches_dequantized(m, n, k, config, bias):
    w, scale = quantized(n, k, seed=m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    expected = torch.nn.functional.linear(x.float(), w.float() * scale,
                                          None if b is None else b.float())
    actual = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
    # FP8 activations (w8a8) round each to 3 mantissa bits: a looser bound
    tol = 2e-2 if config.kernel == "w8" else 1.5e-1
    torch.testing.assert_close(actual.float(), expected, atol=tol, rtol=tol)
    relative = (actual.float() - expected).norm() / expected.norm()
    assert relative < (1e-2 if config.kernel == "w8" else 5e-2)


# K split by tickets (split_tickets.py) beside one part and atomic parts: small tiles, so
# that the cases cover several tiles of rows and columns, a partial last K step and a split
# past K (k 64: 3 parts of one 32-column step, the third empty)
TICKET_CONFIGS = tuple(Config(kernel, 16, 32, 4, 1, split, tickets=tickets)
                       for kernel in ("w8", "w8a8")
                       for split, tickets in ((1, False), (3, False), (3, True)))
TICKET_CASES = [dict(m=3, n=40, k=130, bias=True), dict(m=17, n=48, k=64),
                dict(m=33, n=16, k=200, bias=True)]


def operands(m, n, k, bias, dtype, device):
    """(x, E4M3 weight, its scale, bias or None, the dequantized product in float64)."""
    wide = randn((n, k), "float32", device, seed=2, scale=k ** -0.5)
    scale = wide.abs().amax(1, keepdim=True) / fp8_gemm.FP8_MAX
    w = (wide / scale).to(fp8_gemm.FP8)
    x = randn((m, k), dtype, device, seed=1)
    b = randn((n,), dtype, device, seed=3) if bias else None
    expected = torch.nn.functional.linear(x.double(), w.double() * scale.double(),
                                          None if b is None else b.double())
    return x, w, scale, b, expected


def check_tickets(m, n, k, bias=False, dtype="float32", device="cpu",
                  configs=TICKET_CONFIGS):
    x, w, scale, b, expected = operands(m, n, k, bias, dtype, device)
    one_part = {}
    for config in configs:
        actual = fp8_gemm.fp8_weight_linear(x, w, scale, b, config)
        assert actual.shape == (m, n) and actual.dtype == x.dtype
        # FP8 activations (w8a8) round each to 3 mantissa bits: their error is relative to
        # the output's norm; w8 on CUDA: tf32 or 16 bits
        if config.kernel == "w8":
            torch.testing.assert_close(actual.double(), expected, atol=2e-2, rtol=2e-2)
        else:
            assert (actual.double() - expected).norm() / expected.norm() < 8e-2
        # any split: the same products as one part, summed in another order
        first = one_part.setdefault(config.kernel, actual)
        torch.testing.assert_close(actual, first, atol=1e-2, rtol=1e-2)
        if config.tickets:  # the same bits again, every counter back at 0
            assert torch.equal(fp8_gemm.fp8_weight_linear(x, w, scale, b, config), actual)
            assert not split_tickets._counters[x.device].any()


def check_tickets_on_cuda(**case):
    check_tickets(**case, configs=[c for c in fp8_gemm.CONFIGS if c.tickets])


test_tickets_interpreted, _ = case_tests(__name__, check_tickets, TICKET_CASES, uses_dot=True)
_, test_tickets_cuda = case_tests(__name__, check_tickets_on_cuda, TICKET_CASES)


@cuda
@pytest.mark.parametrize("m", [1, 2, 4, 40, 300])
def test_linear_picks_a_kernel_that_matches(m):
    w, scale = quantized(512, 1024)
    x = torch.randn(2, m, 1024, device="cuda", dtype=torch.bfloat16)
    expected = x.float() @ (w.float() * scale).t()
    actual = fp8_gemm.linear(x, w, scale, None)
    assert actual.shape == (2, m, 512)
    # FP8 activations round to 3 mantissa bits: the error relative to the output's norm
    assert (actual.float() - expected).norm() / expected.norm() < 5e-2


@cuda
def test_rows_quantized_in_one_kernel_match_torch():
    x = torch.randn(5, 1000, device="cuda", dtype=torch.bfloat16) * 3
    x[2] = 0
    q, scale = fp8_gemm.quantize_rows(x)
    expected_scale = x.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / fp8_gemm.FP8_MAX
    torch.testing.assert_close(scale, expected_scale)
    torch.testing.assert_close(q.float(), (x.float() / expected_scale).to(fp8_gemm.FP8).float())


def test_fast_accumulation_is_on_by_default_and_a_bad_value_an_error(monkeypatch):
    monkeypatch.delenv("PARASHIFT_FP8_FAST_ACCUM", raising=False)
    assert fp8_gemm.fast_accum()
    monkeypatch.setenv("PARASHIFT_FP8_FAST_ACCUM", "0")
    assert not fp8_gemm.fast_accum()
    monkeypatch.setenv("PARASHIFT_FP8_FAST_ACCUM", "yes")
    with pytest.raises(ValueError, match="PARASHIFT_FP8_FAST_ACCUM='yes'"):
        fp8_gemm.fast_accum()


@cuda
def test_a_prefill_with_fast_accumulation_stays_near_the_exact_sums(monkeypatch):
    w, scale = quantized(1024, 4096)
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("PARASHIFT_FP8_FAST_ACCUM", "0")
    exact = fp8_gemm.linear(x, w, scale, None).float()
    monkeypatch.setenv("PARASHIFT_FP8_FAST_ACCUM", "1")
    fast = fp8_gemm.linear(x, w, scale, None).float()
    assert (fast - exact).norm() / exact.norm() < 1e-2


@cuda
@pytest.mark.parametrize("k", [1000, 4096, 14336])
def test_rows_quantized_at_any_warps_are_the_same_bits(k):
    x = torch.randn(7, 2 * k, device="cuda", dtype=torch.bfloat16)[:, :k] * 3
    q, scale = fp8_gemm.quantize_rows(x, num_warps=4)
    for warps in (1, 8, 16):
        q_w, scale_w = fp8_gemm.quantize_rows(x, num_warps=warps)
        assert torch.equal(scale_w, scale) and torch.equal(q_w.view(torch.uint8),
                                                           q.view(torch.uint8))


@cuda
@pytest.mark.parametrize("m", [3, 40, 300])
def test_rows_quantized_before_are_taken_where_the_choice_quantizes(m):
    """`linear` given rows quantized already (of another x here, to tell them apart)
    multiplies those where its kernel quantizes activations, as `quantizes_activations`
    says before the call, and x itself where it reads bf16 (the GEMV, w8)."""
    w, scale = quantized(512, 1024)
    x, other = torch.randn(2, m, 1024, device="cuda", dtype=torch.bfloat16)
    fp8_gemm.linear(x, w, scale, None)  # measures the shape's choice
    quantizes = fp8_gemm.quantizes_activations(m, w, x.dtype, x.device, False)
    assert quantizes or m <= fp8_gemm.MAX_ROWS
    got = fp8_gemm.linear(x, w, scale, None, fp8_gemm.quantize_rows(other))
    expected = fp8_gemm.linear(other if quantizes else x, w, scale, None)
    # a split-K choice sums with atomics, in any order: not bit for bit
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)
    for config in [c for c in fp8_gemm.CONFIGS if c.kernel == "w8a8"][:2]:
        assert torch.equal(
            fp8_gemm.fp8_weight_linear(x, w, scale, None, config, fp8_gemm.quantize_rows(other)),
            fp8_gemm.fp8_weight_linear(other, w, scale, None, config))
    assert torch.equal(fp8_gemm.scaled_mm_linear(x, w, scale, None, fp8_gemm.quantize_rows(other)),
                       fp8_gemm.scaled_mm_linear(other, w, scale, None))


def test_gemv_configs_are_measured_up_to_four_rows_only():
    for rows in (1, 4):
        assert set(fp8_gemm.GEMV_CONFIGS) <= set(fp8_gemm.candidates(rows, 4096))
    assert not {c.kernel for c in fp8_gemm.candidates(5, 4096)} & {"gemv"}
    assert all(c.block_n <= 16 for c in fp8_gemm.candidates(1, 10))


def test_the_gemv_and_tma_configs_come_first_the_preferred_in_a_tie(monkeypatch):
    monkeypatch.setenv(fp8_gemm_tma.ENV, "1")
    assert fp8_gemm.candidates(1, 4096)[:2] == list(fp8_gemm.GEMV_CONFIGS[:2])
    assert fp8_gemm.GEMV_CONFIGS[0].block_n == 8 and fp8_gemm.GEMV_CONFIGS[0].block_k == 1024
    assert fp8_gemm.candidates(64, 4096)[0] == fp8_gemm.TMA_CONFIGS[0]


def test_rows_share_a_choice_per_count_up_to_four_then_per_query_tile():
    assert [fp8_gemm.row_bucket(r) for r in (1, 2, 3, 4, 5, 16, 17, 64)] == \
        [1, 2, 3, 4, 16, 16, 32, 64]


@cuda
def test_chosen_gemv_matches_on_a_row_slice_of_a_wider_weight():
    wide, scale = quantized(256, 1024 + 64)
    w = wide[:, :1024]
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x.float(), w.float() * scale, bias.float())
    for config in fp8_gemm.GEMV_CONFIGS:
        actual = fp8_gemm.fp8_weight_linear(x, w, scale, bias, config)
        torch.testing.assert_close(actual.float(), expected, atol=2e-2, rtol=2e-2)


@cuda
def test_replayed_timings_cover_every_candidate_on_copies_of_a_strided_weight():
    wide, scale = quantized(512, 1024 + 64)
    w = wide[:, :1024]
    copies = gemm_timing.weight_copies(w)
    assert len(copies) >= 2 and all(c.stride() == w.stride() and torch.equal(c, w)
                                    for c in copies)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    timings = fp8_gemm.timings_ms(x, w, scale, None)
    assert set(timings) == {None, *fp8_gemm.candidates(1, 512)}
    assert all(t > 0 for t in timings.values())
