"""How the GEMMs time their candidates (kernels/gemm_timing.py): the switch between the
graph of one kernel's calls and the decode chain, the chain's input-writing kernel, and the
choice made from the chain's timings (faked on the CPU, measured on CUDA)."""
import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import fp8_gemm, gemm_timing, skinny_gemm
from tests.kernels.common import assert_exact, cuda, randn


@pytest.mark.parametrize("flag, chained", [(None, True), ("graph", False), ("chain", True),
                                           ("flushed", False)])
def test_the_switch_picks_the_chain_or_the_graph(monkeypatch, flag, chained):
    if flag is None:
        monkeypatch.delenv(gemm_timing.TIMING_ENV, raising=False)
    else:
        monkeypatch.setenv(gemm_timing.TIMING_ENV, flag)
    assert gemm_timing.chained() == chained
    assert gemm_timing.flushed() == (flag == "flushed")
    x = torch.randn(3, 8)[:, :5]
    timed, chain = gemm_timing.timed_input(x)
    if chained:
        assert timed is not x and timed.is_contiguous() and torch.equal(timed, x)
        assert chain[1] is timed and torch.equal(chain[0], x)
    else:
        assert timed is x and chain is None


def test_a_bad_timing_mode_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(gemm_timing.TIMING_ENV, "pdl")
    with pytest.raises(ValueError, match="PARASHIFT_GEMM_TIMING='pdl'"):
        gemm_timing.chained()


def test_the_chain_times_every_config_after_the_input_kernel_and_takes_the_fastest(
        monkeypatch):
    monkeypatch.setenv(gemm_timing.TIMING_ENV, "chain")
    seen = {}
    fast = skinny_gemm.GEMV_CONFIGS[-1]

    def fake_replayed(runs, copies, chain):
        seen.update(runs=set(runs), copies=copies, chain=chain)
        return {key: 1.0 if key == fast else 2.0 for key in runs}
    monkeypatch.setattr(gemm_timing, "weight_copies", lambda w: [w, w.clone()])
    monkeypatch.setattr(gemm_timing, "replayed_timings_ms", fake_replayed)
    x, w = torch.randn(1, 64), torch.randn(4096, 64)
    timings = skinny_gemm.timings_ms(x, w, None)
    assert seen["runs"] == {None, *skinny_gemm.measured(4096)} and seen["copies"] == 2
    assert seen["chain"] is not None and torch.equal(seen["chain"][0], x)
    assert gemm_timing.steady_choice(timings, skinny_gemm.MARGIN) == fast


A, B, C = skinny_gemm.GEMV_CONFIGS[:3]  # listed in this order


@pytest.mark.parametrize("timings, spread, expected", [
    ({None: 10.0, A: 8.0, B: 9.0}, {}, A),
    ({None: 10.0, A: 9.9, B: 9.8}, {}, None),  # within the library's margin (3%)
    ({None: 10.0, A: 12.0}, {}, None),
    ({None: 10.0}, {}, None),
    ({None: 10.0, A: 8.03, B: 8.0}, {}, A),  # a tie (0.4%) keeps the one listed first
    ({None: 10.0, A: 8.0, B: 8.03}, {}, A),
    ({None: 10.0, A: 8.10, B: 8.0}, {}, B),  # 1.2% is a win
    ({None: 10.0, A: 8.30, B: 8.03, C: 8.0}, {}, B),  # C beats A by 3.6%, not B (0.4%)
    ({None: 10.0, A: 8.30, B: 8.0}, {B: 0.05}, A),  # B's rounds spread 5%: a noisy win
    ({None: 10.0, A: 8.30, B: 8.0}, {A: 0.01, B: 0.01}, B),  # a clear win switches
    ({None: 10.0, A: 8.30, B: 8.0}, {A: 0.05}, A),  # the kept one's own spread alike
    ({None: 10.0, A: 9.0, B: 8.0}, {A: 0.05, B: 0.05}, B),  # 11% beats a 5% spread
    ({None: 10.0, A: 9.75, B: 9.6}, {}, B),  # A ties B but misses the library's margin
    ({None: 10.0, A: 9.5}, {None: 0.06}, None),  # 5% under cuBLAS, which spread 6%
    ({A: 8.03, B: 8.0}, {}, A),  # no reference timed: the candidates' pick
])
def test_the_choice_keeps_the_listed_config_unless_clearly_beaten(timings, spread, expected):
    assert gemm_timing.steady_choice(gemm_timing.Timings(timings, spread),
                                     skinny_gemm.MARGIN) == expected


def test_an_infinite_library_margin_forces_the_candidates_whatever_the_spread():
    timings = gemm_timing.Timings({None: 1.0, A: 5.0, B: 4.0}, {None: 0.5, A: 0.5})
    assert gemm_timing.steady_choice(timings, float("inf")) == A


def test_a_plain_dict_of_timings_has_no_spread():
    assert gemm_timing.steady_choice({None: 10.0, A: 8.3, B: 8.0}, 0.97) == B


@pytest.mark.parametrize("samples, spread", [
    ([1.0], 0.0), ([2.0, 2.0, 2.0], 0.0), ([1.0, 2.0, 3.0, 4.0, 5.0], 2 / 3),
    ([5.0, 1.0, 3.0, 2.0, 4.0], 2 / 3)])
def test_the_spread_is_the_interquartile_range_over_the_median(samples, spread):
    assert gemm_timing.relative_spread(samples) == pytest.approx(spread)


@pytest.mark.parametrize("flag, replayed", [(None, True), ("graph", True), ("flushed", False)])
def test_the_bf16_choice_replays_graphs_unless_asked_to_flush(monkeypatch, flag, replayed):
    """The skinny GEMM times its candidates in graphs over weight copies by default (as the
    FP8 GEMM does: a flush's write-backs and events priced GEMV configs at 3x what decode
    runs them at), with L2 flushed only under PARASHIFT_GEMM_TIMING=flushed."""
    if flag is None:
        monkeypatch.delenv(gemm_timing.TIMING_ENV, raising=False)
    else:
        monkeypatch.setenv(gemm_timing.TIMING_ENV, flag)
    seen = []
    monkeypatch.setattr(gemm_timing, "weight_copies", lambda w: [w, w.clone()])
    monkeypatch.setattr(gemm_timing, "replayed_timings_ms", lambda runs, copies, chain:
                        seen.append("graph") or dict.fromkeys(runs, 1.0))
    monkeypatch.setattr(skinny_gemm.triton.testing, "do_bench",
                        lambda fn, **kwargs: seen.append("flushed") or 1.0)
    x, w = torch.randn(1, 64), torch.randn(4096, 64)
    timings = skinny_gemm.timings_ms(x, w, None)
    assert set(timings) == {None, *skinny_gemm.measured(4096)}
    assert set(seen) == ({"graph"} if replayed else {"flushed"})


@cuda
def test_the_input_kernel_copies_its_source():
    src = randn((3, 5000), "bfloat16", "cuda")
    dst = torch.zeros_like(src)
    gemm_timing.write_input(src, dst)
    assert_exact(dst, src)


def few_configs(monkeypatch) -> None:
    """A few candidates of each kind (each compiles in seconds on a GPU)."""
    gemv = [c for c in fp8_gemm.GEMV_CONFIGS if c.block_n == 4 and c.split_k == 1][:2]
    monkeypatch.setattr(fp8_gemm, "CONFIGS", fp8_gemm.CONFIGS[:1])
    monkeypatch.setattr(fp8_gemm, "GEMV_CONFIGS", (*gemv, fp8_gemm.GEMV_CONFIGS[-1]))
    monkeypatch.setattr(skinny_gemm, "MEASURED", (skinny_gemm.CONFIGS[0],
                                                  *skinny_gemm.GEMV_CONFIGS[-3:]))
    monkeypatch.setattr(skinny_gemm, "GEMV_CONFIGS", skinny_gemm.GEMV_CONFIGS[-3:])


@cuda
@pytest.mark.parametrize("mode", ["graph", "chain", "flushed"])
def test_both_modes_time_every_candidate_and_choose_one_that_matches(monkeypatch, mode):
    few_configs(monkeypatch)
    monkeypatch.setenv(gemm_timing.TIMING_ENV, mode)
    x = randn((1, 1024), "bfloat16", "cuda")
    w = randn((512, 1024), "bfloat16", "cuda", scale=1024 ** -0.5)
    timings = skinny_gemm.timings_ms(x, w, None)
    assert set(timings) == {None, *skinny_gemm.measured(512)}
    assert all(t > 0 for t in timings.values())
    wq, scale = (w.float() / 2 ** -4).to(fp8_gemm.FP8), torch.full((512, 1), 2 ** -4,
                                                                    device="cuda")
    fp8_timings = fp8_gemm.timings_ms(x, wq, scale, None)
    assert set(fp8_timings) == {None, *fp8_gemm.candidates(1, 512)}
    monkeypatch.setattr(skinny_gemm, "_choices", {})
    torch.testing.assert_close(skinny_gemm.linear(x, w, None), F.linear(x, w),
                               rtol=2 ** -7, atol=2 ** -7)
