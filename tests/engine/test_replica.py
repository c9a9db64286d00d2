"""One replica's step messages (plain decodes in columns, first), and one group's view from
the views of the replicas it serves (a pipeline's replica per stage)."""
import dataclasses

from parashift.config import SchedulerConfig
from parashift.engine.policy import GroupView
from parashift.engine.replica import Replica, combine_views
from parashift.engine.sequence import Sequence
from parashift.kv.block_manager import BlockManager
from parashift.sampling_params import SamplingParams
from parashift.step.message import PLACEHOLDER_TOKEN


def test_plain_decodes_go_first_in_columns_and_the_schedule_follows_the_message():
    """A prompt's chunk ahead of decodes in the running order: the scheduler gives the
    decodes in columns, then the chunk (blocks taken in the running order), and the message
    holds them in that order (the decodes in columns, one with the block it starts): the
    order the sampled tokens follow."""
    replica = Replica(BlockManager(64, 4), SchedulerConfig(
        max_model_len=64, max_num_batched_tokens=14, long_prefill_token_threshold=8), {0})
    params = SamplingParams(max_tokens=20)
    for request_id, prompt in (("long", 32), ("a", 4), ("b", 2)):
        replica.scheduler.add(Sequence(request_id, list(range(1, prompt + 1)), params))
    prompts = replica.scheduler.schedule()  # long: 8 of 32 tokens; a's and b's prompts
    batch = replica.step_batch(prompts, "single")
    assert batch.decode_ids == [] and [c.request_id for c in batch.chunks] == ["long", "a", "b"]
    sched = replica.scheduler.schedule()  # a's and b's tokens on their way (async)
    assert [(s.seq.request_id, s.start_pos) for s in sched.scheduled] == [
        ("a", 4), ("b", 2), ("long", 8)]
    assert sched.num_decodes == 2 and sched.scheduled[2].seq.block_table == [0, 1, 4, 5]
    batch = replica.step_batch(sched, "single")
    a, b, long = (s.seq for s in sched.scheduled)
    assert [seq.request_id for seq in (a, b, long)] == ["a", "b", "long"]
    assert (batch.decode_ids, batch.decode_starts, batch.decode_blocks) == (
        ["a", "b"], [4, 2], [1, 1])
    assert len(a.block_table) == 2 and batch.decode_new_blocks == {0: a.block_table[1:]}
    assert [(c.request_id, c.token_ids, c.start_pos, c.blocks_from, c.new_blocks)
            for c in batch.chunks] == [("long", list(range(9, 17)), 8, 2, long.block_table[2:])]
    assert [c.request_id for c in batch.all_chunks()] == ["a", "b", "long"]
    assert batch.all_chunks()[0].new_blocks == a.block_table[1:]
    replica.scheduler.update(prompts, [7, 8])  # long's chunk sampled nothing
    replica.scheduler.update(sched, [10, 11])  # a's and b's, in the message's order
    assert (a.token_ids[-2:], b.token_ids[-2:]) == ([7, 10], [8, 11])


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
        step_s=0.02, prefill_tokens_per_s=3000.0, prompt_tokens_left=9, waiting_decode_most=60)
    assert combine_views([first, second]) == GroupView(
        "pp2", num_waiting=3, num_running=4, tokens_waiting=41, next_step_tokens=6,
        kv_blocks_used=7, kv_blocks_free=8, priorities=(-1, 0), longest_context=900,
        arrival_rate=1.5, cpu_tier_fill=1.0, cpu_tier_free_run=64, next_prompt_tokens=30,
        kv_capacity=4096, longest_need=800, longest_decode_left=70, recompute_tokens=501,
        step_s=1.0, prefill_tokens_per_s=1.0, prompt_tokens_left=10, waiting_decode_most=60)
    unmeasured = dataclasses.replace(first, prefill_tokens_per_s=0.0)
    assert combine_views([unmeasured, second]).prefill_tokens_per_s == 3000.0
    assert combine_views([second]) is second
