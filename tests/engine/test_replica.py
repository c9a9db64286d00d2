"""One group's view from the views of the replicas it serves (a pipeline's replica per stage)."""
import dataclasses

from parashift.engine.policy import GroupView
from parashift.engine.replica import combine_views


def test_a_group_view_adds_counts_and_takes_the_most_of_sizes_and_times():
    fields = [f.name for f in dataclasses.fields(GroupView) if f.name != "plan"]
    first = GroupView("pp2", **{name: (1.0 if name in ("arrival_rate", "cpu_tier_fill",
                                                       "step_s", "prefill_tokens_per_s")
                                       else (0,) if name == "priorities" else 1)
                                for name in fields})
    second = dataclasses.replace(
        first, num_waiting=2, num_running=3, tokens_waiting=40, next_step_tokens=5,
        kv_blocks_used=6, kv_blocks_free=7, priorities=(-1, 0), longest_context=900,
        arrival_rate=0.5, cpu_tier_fill=0.25, cpu_tier_free_run=64, next_prompt_tokens=30,
        kv_capacity=4096, longest_need=800, longest_decode_left=70, recompute_tokens=500,
        step_s=0.02, prefill_tokens_per_s=3000.0, prompt_tokens_left=9)
    assert combine_views([first, second]) == GroupView(
        "pp2", num_waiting=3, num_running=4, tokens_waiting=41, next_step_tokens=6,
        kv_blocks_used=7, kv_blocks_free=8, priorities=(-1, 0), longest_context=900,
        arrival_rate=1.5, cpu_tier_fill=1.0, cpu_tier_free_run=64, next_prompt_tokens=30,
        kv_capacity=4096, longest_need=800, longest_decode_left=70, recompute_tokens=501,
        step_s=1.0, prefill_tokens_per_s=1.0, prompt_tokens_left=10)
    unmeasured = dataclasses.replace(first, prefill_tokens_per_s=0.0)
    assert combine_views([unmeasured, second]).prefill_tokens_per_s == 3000.0
    assert combine_views([second]) is second
