"""The profile's fits on recorded numbers: lines through timed points, bandwidths that never
beat the copy, FLOPs rates only from FLOPs-bound points, host work per step and per sequence;
and the first H200 profile's decode-attention fit, which these fits replace."""
import math

import pytest

from parashift.cost.fit import (bytes_line, flops_eff, flops_line, host_line, robust_line,
                                roofline)
from parashift.cost.profile import load
from parashift.cost.shape import SHAPES, load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan

HBM, MATMUL = 4.27e12, 788e12  # an H200's copy and bf16 ceilings (docs/benchmark_log.md)
RAW_FIRST = SHAPES.parent / "results" / "raw" / "cost_profile_h200_first" / "h200_compute.json"


def test_the_line_passes_through_points_on_it_and_ignores_an_outlier():
    line = robust_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
    assert (line.intercept, line.slope) == (1.0, 2.0)
    # a busy host's slow sample (the CPU run of this test's profile once gave 20 ms for 0.1)
    line = robust_line([1.0, 2.0, 4.0, 8.0], [3.0, 5.0, 200.0, 17.0])
    assert (line.intercept, line.slope) == (1.0, 2.0)
    assert robust_line([2.0, 2.0], [4.0, 6.0]).slope == 2.5  # one x: through the origin
    with pytest.raises(ValueError, match="as many x as y"):
        robust_line([1.0], [])


def test_bytes_line_recovers_the_launch_and_bandwidth_of_gemv_points():
    # batch-1 GEMMs of the 8B shape: 3 us each beyond their bytes at 0.954 of the copy
    # (docs/benchmark_log.md, GPU fast path, one GPU)
    sizes = [2 * 6144 * 4096, 2 * 4096 * 4096, 2 * 28672 * 4096, 2 * 4096 * 14336]
    points = [(b, 3e-6 + b / (HBM * 0.954)) for b in sizes]
    launch, bw = bytes_line(points, HBM)
    assert math.isclose(launch, 3e-6, rel_tol=1e-6) and math.isclose(bw, 0.954, rel_tol=1e-9)


def test_a_bandwidth_above_the_copy_is_capped_and_a_negative_intercept_refit():
    launch, bw = bytes_line([(1e9, 1e9 / (2 * HBM)), (2e9, 2e9 / (2 * HBM))], HBM)
    assert bw == 1.0 and launch == 0.0
    # a GEMV only reads its weights: it may beat the copy (read and write) that sets the peak
    launch, bw = bytes_line([(1e9, 1e9 / (2 * HBM)), (2e9, 2e9 / (2 * HBM))], HBM,
                            reads_only=True)
    assert math.isclose(bw, 2.0, rel_tol=1e-9) and launch == 0.0
    launch, bw = bytes_line([(1e9, 0.2e-3), (2e9, 0.5e-3)], HBM)  # intercept -0.1 ms
    assert launch == 0.0 and 0 < bw <= 1.0
    with pytest.raises(ValueError, match="do not grow with bytes"):
        bytes_line([(1e9, 2e-3), (2e9, 1e-3)], HBM)


def test_flops_eff_leaves_the_launch_out():
    flops = [2.0 * 8192 * 4096 * 14336, 2.0 * 4096 * 4096 * 14336]
    points = [(f, 5e-6 + f / (MATMUL * 0.8583)) for f in flops]
    assert math.isclose(flops_eff(points, MATMUL, 5e-6), 0.8583, rel_tol=1e-9)
    with pytest.raises(ValueError, match="no FLOPs-bound time"):
        flops_eff([(1e12, 1e-6)], MATMUL, 1e-5)


def test_prefill_attention_gets_its_own_fixed_cost_and_rate_from_its_flops():
    # causal prefill of 2k-8k tokens at 0.5135 of 788 TFLOP/s, 10 us fixed (the H200 profile)
    flops = [4.0 * 32 * 128 * n * n / 2 for n in (2048, 4096, 8192)]
    launch, eff = flops_line([(f, 10e-6 + f / (MATMUL * 0.5135)) for f in flops], MATMUL)
    assert math.isclose(launch, 10e-6, rel_tol=1e-6) and math.isclose(eff, 0.5135, rel_tol=1e-9)
    with pytest.raises(ValueError, match="do not grow with FLOPs"):
        flops_line([(1e9, 2e-3), (4e9, 1e-3)], MATMUL)


def test_elementwise_launch_counts_the_kernels_a_layer_launches():
    points = [(b, 2e-6 + b / (HBM * 0.8)) for b in (32768, 8 << 20, 512 << 20)]
    fit = roofline(points, [], HBM, MATMUL, launch_scale=6)
    assert math.isclose(fit.launch_s, 12e-6, rel_tol=1e-6)
    assert math.isclose(fit.bw_eff, 0.8, rel_tol=1e-9) and fit.flops_eff == 1.0


def test_host_work_per_step_and_per_sequence_from_the_recorded_h200_runs():
    # host work per sequence on an H200 host: 5.61 us at batch 256, 3.03 us at 1,024
    # (benchmarks/results/host_overhead.json, host1-256 and host1-1024)
    points = [(256, 256 * 5.61e-6), (1024, 1024 * 3.03e-6)]
    per_step, per_seq = host_line(points)
    assert math.isclose(per_seq, (1024 * 3.03e-6 - 256 * 5.61e-6) / 768, rel_tol=1e-9)
    assert math.isclose(per_step + 256 * per_seq, 256 * 5.61e-6, rel_tol=1e-9)
    assert host_line([(1, 2.5e-4), (64, 1.25e-4)]) == (1.875e-4, 0.0)  # never shrinking
    assert host_line([(1, 1e-6), (64, 9e-4)])[0] == 0.0


def decode_attention_s(profile, batch: int, context: int) -> float:
    model = StepModel(load_shape("llama-3.1-8b"), profile)
    return model.step(Plan(), StepBatch.decode(batch, context)).parts["attention"]


def test_decode_attention_fitted_by_bytes_is_priced_by_bytes_for_a_gqa_model():
    """The first H200 profile took decode attention's flops_eff from a bytes-bound point of
    a model without GQA (0.0097): the 8B's 4 query heads a KV head made its decode FLOPs-bound
    at 2.3x the KV read. Fitted on the grid's bytes, the recorded 256 x 1024 in 256 us
    (docs/benchmark_log.md) comes back within the fit."""
    from dataclasses import replace
    raw = load(RAW_FIRST)
    kv = 256 * 1025 * 2 * 8 * 128 * 2 + 256 * 32 * 128 * 2 * 2  # step.py's bytes, 32 layers
    bytes_only = kv / (raw.hbm_bytes_per_s * raw.decode_attention.bw_eff)
    assert decode_attention_s(raw, 256, 1024) > 2 * 32 * bytes_only
    grid = [(b * c * 2 * 8 * 128 * 2, 8e-6 + b * c * 2 * 8 * 128 * 2 / 4.19e12)
            for b in (1, 64, 256) for c in (1024, 8192)]
    launch, bw = bytes_line(grid, HBM)
    fixed = replace(raw, hbm_bytes_per_s=HBM,
                    decode_attention=roofline(grid, [], HBM, raw.matmul_flops))
    assert math.isclose(launch, 8e-6, rel_tol=1e-6)
    per_layer = decode_attention_s(fixed, 256, 1024) / 32
    assert math.isclose(per_layer, 8e-6 + kv / (HBM * bw), rel_tol=1e-9)
    assert abs(per_layer / 256e-6 - 1) < 0.05
