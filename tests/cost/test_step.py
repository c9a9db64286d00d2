"""The step model's arithmetic on small hand-made profiles (exact), and on the committed
H200 profiles (pinned predictions, so a change to the model shows in its diff)."""
import math
from dataclasses import replace

import pytest

from parashift.cost.profile import ComputeProfile, Roofline, load
from parashift.cost.shape import ModelShape, load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan
from tests.cost.test_profile import PROFILES, link

SHAPE = ModelShape("toy", num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate=128, vocab=256)
FLAT = Roofline(1.0, 1.0, 0.0)


def compute(**changes) -> ComputeProfile:
    fields = dict(device="test", source="this test", hbm_bytes_per_s=1e9, matmul_flops=1e12,
                  memory_bytes=1e9, memory_utilization=0.5, activation_bytes=1e6, gemm=FLAT,
                  decode_attention=FLAT, prefill_attention=FLAT, elementwise=FLAT, moe=FLAT,
                  sampler_s=0.0, sampler_row_s=0.0, host_step_s=0.0, eager_launch_s=0.0,
                  kernels_per_layer=1, host_to_device_bytes_per_s=1e9)
    return ComputeProfile(**(fields | changes))


def gemm_bytes(rows, n, k):
    return 2 * (n * k + rows * (n + k))


def test_a_single_gpu_decode_step_is_its_kernels_bytes_at_the_copy_rate():
    model = StepModel(SHAPE, compute())
    parts = model.step(Plan(), StepBatch.decode(1, 9)).parts
    per_layer = (gemm_bytes(1, 128, 64) + gemm_bytes(1, 64, 64) + gemm_bytes(1, 256, 64)
                 + gemm_bytes(1, 64, 128))
    assert math.isclose(parts["gemm"], 2 * per_layer / 1e9, rel_tol=1e-12)
    kv = 10 * 2 * 2 * 16 * 2 + 4 * 16 * 2 * 2   # 10 tokens' K and V, 2 heads; q and out
    assert math.isclose(parts["attention"], 2 * kv / 1e9, rel_tol=1e-12)
    assert math.isclose(parts["lm_head"], gemm_bytes(1, 256, 64) / 1e9, rel_tol=1e-12)


def test_tensor_parallel_halves_the_weights_and_adds_two_all_reduces_a_layer():
    one = StepModel(SHAPE, compute()).step(Plan(), StepBatch.decode(1, 9)).parts
    two = StepModel(SHAPE, compute(), link()).step(Plan(tp=2), StepBatch.decode(1, 9)).parts
    assert two["gemm"] < one["gemm"]
    assert math.isclose(two["all_reduce"], 2 * 2 * 1e-5, rel_tol=1e-12)  # 128 B: latency


def test_sequence_parallel_splits_the_tokens_and_exchanges_them():
    links = link(names=("all_to_all", "all_gather"))
    model = StepModel(SHAPE, compute(), links, graphs=False)
    sp = model.step(Plan(sp=2), StepBatch.prefill(8)).parts
    one = StepModel(SHAPE, compute(), graphs=False).step(Plan(), StepBatch.prefill(4)).parts
    assert math.isclose(sp["gemm"], one["gemm"], rel_tol=1e-12)  # 4 rows a rank, whole weights
    curve = links.collectives["all_to_all"]["graph"]
    exchange = curve(4 * (64 + 2 * 32) * 2) + curve(4 * 64 * 2)  # q/k/v in, output back
    assert math.isclose(sp["all_to_all"], 2 * exchange, rel_tol=1e-12)
    with pytest.raises(ValueError, match="has no all_to_all"):
        StepModel(SHAPE, compute(), link()).step(Plan(sp=2), StepBatch.prefill(8))


def test_a_multi_rank_plan_needs_a_link_profile():
    with pytest.raises(ValueError, match="needs a link profile"):
        StepModel(SHAPE, compute()).step(Plan(tp=2), StepBatch.decode(1, 1))


def test_kv_tokens_are_the_free_memory_over_each_token_bytes():
    model = StepModel(SHAPE, compute())
    free = 0.5e9 - 1e6 - SHAPE.weight_bytes
    assert model.kv_tokens(Plan()) == int(free // SHAPE.kv_bytes_per_token)
    assert model.kv_tokens(Plan(dp=2)) == 2 * model.kv_tokens(Plan())


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'no-such'.*llama-3.1-8b"):
        load_shape("no-such")


# Predictions of the committed profiles, pinned: a change to the model or a profile moves them.
PINNED = [("single", StepBatch.decode(1, 1024), 1, 4.866711),
          ("single", StepBatch.decode(256, 1024), 1, 16.388238),
          ("single", StepBatch.prefill(4096), 1, 104.151068),
          ("tp2", StepBatch.decode(64, 512), 2, 4.627805),
          ("tp4", StepBatch.decode(1, 2112), 4, 2.761987)]


@pytest.mark.parametrize("plan,batch,gpus,ms", PINNED)
def test_pinned_predictions_of_the_committed_h200_profiles(plan, batch, gpus, ms):
    links = {1: None, 2: load(PROFILES / "h200x2_link.json"), 4: load(PROFILES / "h200x4_link.json")}
    model = StepModel(load_shape("llama-3.1-8b"), load(PROFILES / "h200_compute.json"), links[gpus])
    assert math.isclose(model.step_s(Plan.parse(plan), batch) * 1e3, ms, rel_tol=1e-5)


def test_host_work_adds_to_a_graph_step_or_overlaps_it_as_the_profile_says():
    batch = StepBatch.decode(4, 9)
    added = StepModel(SHAPE, compute(host_step_s=1e-3, host_seq_s=1e-4)).step(Plan(), batch)
    device = sum(v for k, v in added.parts.items() if k != "host")
    assert added.parts["host"] == pytest.approx(1.4e-3) and added.total == pytest.approx(
        device + 1.4e-3)
    overlapped = StepModel(SHAPE, compute(host_step_s=1e-3, host_seq_s=1e-4,
                                          host_overlapped=True)).step(Plan(), batch)
    assert overlapped.total == pytest.approx(max(device, 1.4e-3))
    assert overlapped.parts["host_excess"] == pytest.approx(max(0.0, 1.4e-3 - device))


def test_near_the_ridge_a_kernel_pays_the_overlap_share_of_its_shorter_bound():
    fit = Roofline(0.5, 0.25, 1e-6, overlap=0.2)
    c = compute(gemm=fit)
    # 1e6 bytes at 0.5 x 1e9 B/s: 2 ms; 1e8 FLOPs at 0.25 x 1e12: 0.4 ms
    assert math.isclose(c.roofline_s(fit, 1e6, 1e8), 2e-3 + 0.2 * 0.4e-3 + 1e-6, rel_tol=1e-12)
    assert math.isclose(c.roofline_s(fit, 1e5, 1e9), 4e-3 + 0.2 * 0.2e-3 + 1e-6, rel_tol=1e-12)
    assert math.isclose(c.roofline_s(FLAT, 1e6, 1e8), 1e-3, rel_tol=1e-12)  # no overlap: max
    with pytest.raises(ValueError, match="overlap must be in"):
        Roofline(1.0, 1.0, 0.0, overlap=1.5)


def test_head_norms_read_and_write_the_query_and_key_heads_in_two_more_kernels():
    c = compute(elementwise=Roofline(1.0, 1.0, 6e-6))
    plain = StepModel(SHAPE, c).step(Plan(), StepBatch.prefill(4)).parts["elementwise"]
    normed = StepModel(replace(SHAPE, qk_norm=True), c, fused_qk_norm=False).step(
        Plan(), StepBatch.prefill(4))
    qk_bytes = 4 * 2 * 2 * (64 + 32)  # 4 rows, read and written, 2-byte q (4x16) and k (2x16)
    assert math.isclose(normed.parts["elementwise"] - plain, 2 * (2e-6 + qk_bytes / 1e9),
                        rel_tol=1e-12)  # two layers; the 6 kernels' launch is 6 us
    assert load_shape("qwen3-32b").qk_norm and load_shape("qwen3-30b-a3b").qk_norm
    assert not load_shape("llama-3.1-8b").qk_norm


def test_head_norms_inside_the_rope_kernel_cost_nothing_more_but_not_in_deterministic_mode():
    c = compute(elementwise=Roofline(1.0, 1.0, 6e-6))
    normed = replace(SHAPE, qk_norm=True)
    batch = StepBatch.prefill(4)
    plain = StepModel(SHAPE, c).step(Plan(), batch).parts["elementwise"]
    fused = StepModel(normed, c, fused_qk_norm=True).step(Plan(), batch).parts["elementwise"]
    apart = StepModel(normed, c, fused_qk_norm=False).step(Plan(), batch).parts["elementwise"]
    deterministic = StepModel(normed, c, fused_qk_norm=True, deterministic=True)
    assert fused == plain < apart
    assert deterministic.step(Plan(), batch).parts["elementwise"] == apart
    assert StepModel(normed, c, fused_qk_norm=True).eager().fused_qk_norm


def test_the_defaults_read_the_engines_switches():
    import os
    import subprocess
    import sys

    from parashift.cost import step
    assert step.FUSED_QK_NORM and step.FUSED_ROUTER  # the engine's defaults: on
    read = ("from parashift.cost.step import StepModel; from tests.cost.test_step import SHAPE, "
            "compute; m = StepModel(SHAPE, compute()); print(m.fused_qk_norm, m.fused_router)")
    env = os.environ | {"PARASHIFT_FUSED_QK_NORM": "0", "PARASHIFT_FUSED_ROUTER": "0"}
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_fused_router_at_one_row_drops_the_routing_kernels_launch():
    moe = replace(SHAPE, num_experts=4, top_k=2, expert_intermediate=32)
    c = compute(elementwise=Roofline(1.0, 1.0, 6e-6))
    def moe_s(fused_router, batch):
        return StepModel(moe, c, fused_router=fused_router).step(Plan(), batch).parts["moe"]
    one, two = StepBatch.decode(1, 8), StepBatch.decode(2, 8)
    assert math.isclose(moe_s(False, one) - moe_s(True, one), 2 * 1e-6, rel_tol=1e-9)
    assert moe_s(False, two) == moe_s(True, two)  # two rows: the GEMM and routing apart


def test_an_eager_moe_layer_launches_its_routing_and_expert_kernels_too():
    moe = replace(SHAPE, num_experts=4, top_k=2, expert_intermediate=32)
    c = compute(eager_launch_s=1e-3, kernels_per_layer=3, moe_kernels_per_layer=5)
    eager = StepModel(moe, c, graphs=False).step(Plan(), StepBatch.prefill(4))
    assert math.isclose(eager.total, ((3 + 5) * 2 + 10) * 1e-3, rel_tol=1e-12)  # host-bound
    dense = StepModel(SHAPE, c, graphs=False).step(Plan(), StepBatch.prefill(4))
    assert math.isclose(dense.total, (3 * 2 + 10) * 1e-3, rel_tol=1e-12)


def test_a_timed_weight_shape_is_read_off_its_timings_and_meets_the_roofline_past_them():
    qkv = (128, 64)  # SHAPE's q, k and v projection: 64 + 2 x 32 wide, over 64
    timed = StepModel(SHAPE, compute(gemm_timed=[(*qkv, 1, 2e-6), (*qkv, 16, 5e-6)]))
    roof = StepModel(SHAPE, compute())

    def extra(rows):  # what the timings change in a decode step of `rows` sequences
        batch = StepBatch.decode(rows, 9)
        return timed.step(Plan(), batch).parts["gemm"] - roof.step(Plan(), batch).parts["gemm"]

    def qkv_roof(rows):
        return gemm_bytes(rows, *qkv) / 1e9
    layers = SHAPE.num_layers
    assert math.isclose(extra(1), layers * (2e-6 - qkv_roof(1)), rel_tol=1e-9)
    assert math.isclose(extra(6), layers * (2e-6 + 3e-6 * 5 / 15 - qkv_roof(6)), rel_tol=1e-9)
    departure = qkv_roof(16) - 5e-6  # past the largest count it fades as 16 / rows
    assert math.isclose(extra(64), -layers * departure * 16 / 64, rel_tol=1e-9)
    fp8 = replace(SHAPE, weight_dtype_bytes=1)  # timings are of the model's dtype: not FP8's
    c = compute(gemm_timed=[(*qkv, 1, 2e-6)], fp8_gemm=FLAT, fp8_matmul_flops=1e12)
    assert (StepModel(fp8, c).step(Plan(), StepBatch.decode(1, 9)).parts["gemm"]
            == StepModel(fp8, replace(c, gemm_timed=())).step(
                Plan(), StepBatch.decode(1, 9)).parts["gemm"])


def test_gemm_timings_are_checked():
    for bad, reason in (([(4, 2, 1)], "each entry"), ([(4, 2, 1, 0.0)], "each entry"),
                        ([(4, 2, 1.5, 1e-6)], "each entry"),
                        ([(4, 2, 1, 1e-6), (4, 2, 1, 2e-6)], "timed twice")):
        with pytest.raises(ValueError, match=reason):
            compute(gemm_timed=bad)
    c = compute(gemm_timed=[[4, 2, 16, 3e-6], [4, 2, 1, 1e-6]])
    assert c.gemm_timings(4, 2) == [(1, 1e-6), (16, 3e-6)] and c.gemm_timings(2, 4) == []


def test_a_step_that_prefills_replays_a_mixed_graph_only_where_the_engines_graphs_hold_it():
    """worker/cuda_graphs.py: at most 64 sequences and 2,048 token rows, one stage; a step
    of one prompt chunk beside 255 decodes runs eagerly (its launches on the host)."""
    profile = compute(host_step_s=1e-3, eager_launch_s=1e-2)
    model = StepModel(SHAPE, profile, prefill_graphs=True)
    small = StepBatch.prefill(300)
    crowded = StepBatch(small.seqs + StepBatch.decode(255, 9).seqs)
    assert "host" in model.step(Plan(), small).parts              # a graph: its replay
    assert "host_launch_excess" in model.step(Plan(), crowded).parts  # eager
    assert "host_launch_excess" in model.step(Plan(), StepBatch.prefill(2049)).parts
    wide = StepModel(SHAPE, profile, prefill_graphs=True, mixed_graph_seqs=256)
    assert "host" in wide.step(Plan(), crowded).parts
    buckets = StepModel(SHAPE, profile, prefill_graphs=True, wide_graph_seqs=256)  # wide ones
    assert buckets.step(Plan(), crowded).total == wide.step(Plan(), crowded).total
    assert "host" in buckets.step(Plan(), small).parts
    fuller = StepBatch(crowded.seqs + StepBatch.decode(1, 9).seqs)  # 257 sequences
    assert "host_launch_excess" in buckets.step(Plan(), fuller).parts
    assert "host_launch_excess" in StepModel(SHAPE, profile).step(Plan(), small).parts


def test_a_lone_graph_step_adds_the_measured_lone_host_work_to_its_device_time():
    """StepModel.lone_step_s: a lone prompt's graph step is its device time, then its host
    work per request and per token, none overlapped; an eager step is `step`'s; without
    the measured terms, `step`'s."""
    plain = compute(host_step_s=1e-3, eager_launch_s=1e-2)
    lone = replace(plain, lone_host_s=2e-3, lone_host_token_s=1e-6)
    prompt = StepBatch.prefill(300)
    graphed = StepModel(SHAPE, lone, prefill_graphs=True).step(Plan(), prompt)
    device = sum(v for k, v in graphed.parts.items() if k != "host")
    assert graphed.total == device + 1e-3
    assert StepModel(SHAPE, lone, prefill_graphs=True).lone_step_s(Plan(), prompt) == (
        device + 2e-3 + 300 * 1e-6)
    eager = StepModel(SHAPE, lone)
    assert eager.lone_step_s(Plan(), prompt) == eager.step_s(Plan(), prompt)
    unmeasured = StepModel(SHAPE, plain, prefill_graphs=True)
    assert unmeasured.lone_step_s(Plan(), prompt) == unmeasured.step_s(Plan(), prompt)
    with pytest.raises(ValueError, match="lone_host_s"):
        replace(plain, lone_host_s=-1.0)
