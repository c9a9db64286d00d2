"""Swap preemption in the scheduler: a preempted request's computed tokens go to a slot of
the CPU tier (the step that frees its blocks copies them out), it waits with its computed
count kept, and the step that resumes it copies them into its new blocks."""
from parashift.engine.scheduler import SwapOp
from parashift.engine.sequence import SequenceStatus
from parashift.kv.tier_allocator import TierAllocator, TierSlot
from tests.engine.test_scheduler import make_scheduler, make_seq, step


def make_swap_scheduler(tier_tokens=64, **config):
    sched = make_scheduler(**config)
    sched.swap_slots = TierAllocator(tier_tokens)
    return sched


def two_decoding(sched):
    """a and b (7-token prompts, max_tokens 4) each fill their 2 blocks of a 4-block pool."""
    a = make_seq("a", 7, max_tokens=4)
    b = make_seq("b", 7, max_tokens=4, base=2000)
    sched.add(a)
    sched.add(b)
    assert step(sched) == ([("a", 7, 0), ("b", 7, 0)], [], [])
    assert step(sched) == ([("a", 1, 7), ("b", 1, 7)], [], [])
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    return a, b


def test_preempted_request_swaps_out_and_resumes_where_it_was():
    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    a, b = two_decoding(sched)
    # a needs a third block: b is preempted, its 8 computed tokens swapped out of [2, 3]
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos) for s in out.scheduled] == [
        ("a", 1, 8)]
    assert out.preempted == [b] and out.recompute_tokens == 0
    assert out.swap_out == [SwapOp("b", (2, 3), 8, TierSlot(0, 8))] and out.swap_in == []
    assert a.block_table == [0, 1, 3]  # b's blocks freed tail first; a writes into 3
    assert b.block_table == [] and b.num_computed_tokens == 8
    assert b.status == SequenceStatus.WAITING and b.num_preemptions == 1
    assert sched.swap_slots.used_tokens == 8
    sched.update(out, {"a": 102})
    # b needs 3 blocks for its 9 tokens; one is free
    assert step(sched) == ([("a", 1, 9)], [], ["a"])
    # b is resumed from token 8: its KV comes back into the first two of its new blocks
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos) for s in out.scheduled] == [
        ("b", 1, 8)]
    assert b.block_table == [2, 3, 1]
    assert out.swap_in == [SwapOp("b", (2, 3), 8, TierSlot(0, 8))] and out.swap_out == []
    assert sched.swap_slots.used_tokens == 0  # free for the steps after this one
    sched.update(out, {"b": 102})
    assert step(sched) == ([("b", 1, 9)], [], ["b"])
    assert a.output_token_ids == b.output_token_ids == [100, 101, 102, 103]
    assert sched.block_manager.num_free_blocks == 4


def test_a_full_tier_falls_back_to_recompute():
    sched = make_swap_scheduler(tier_tokens=7, num_blocks=4, max_model_len=16)
    a, b = two_decoding(sched)
    out = sched.schedule()
    assert out.preempted == [b] and out.swap_out == [] and out.recompute_tokens == 8
    assert b.num_computed_tokens == 0 and sched.swap_slots.used_tokens == 0
    sched.update(out, {"a": 102})
    assert step(sched) == ([("a", 1, 9)], [], ["a"])
    out = sched.schedule()  # b from its prefix-cache hit (block 2), computed again after it
    assert [(s.num_new_tokens, s.start_pos) for s in out.scheduled] == [(5, 4)]
    assert out.swap_in == []


def test_second_swap_takes_the_next_free_range():
    sched = make_swap_scheduler(num_blocks=6, max_model_len=16, max_num_batched_tokens=64)
    a = make_seq("a", 8, priority=0)
    b = make_seq("b", 4, priority=1, base=2000)
    c = make_seq("c", 4, priority=2, base=3000)
    for seq in (a, b, c):
        sched.add(seq)
    assert step(sched)[0] == [("a", 8, 0), ("b", 4, 0), ("c", 4, 0)]
    assert (a.block_table, b.block_table, c.block_table) == ([0, 1], [2], [3])
    # a and b take blocks 4 and 5; c, the lowest priority, finds none and preempts itself
    out = sched.schedule()
    assert [(s.seq.request_id, s.start_pos) for s in out.scheduled] == [("a", 8), ("b", 4)]
    assert out.swap_out == [SwapOp("c", (3,), 4, TierSlot(0, 4))]
    sched.update(out, {"a": 5, "b": 6})
    assert [(s.request_id, s.num_computed_tokens) for s in sched.waiting] == [("c", 4)]
    for _ in range(3):  # a and b decode in their blocks (c waits: it needs 2, one is free)
        assert [p[0] for p in step(sched)[0]] == ["a", "b"]
    # a takes block 3 for position 12; b finds none for position 8 and swaps out after c
    out = sched.schedule()
    assert out.preempted == [b] and a.block_table == [0, 1, 4, 3]
    assert out.swap_out == [SwapOp("b", (2, 5), 8, TierSlot(4, 8))]
    assert sched.swap_slots.used_tokens == 12


def test_a_swap_only_step_is_not_empty():
    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    x = make_seq("x", 7, priority=1)
    sched.add(x)
    assert step(sched)[0] == [("x", 7, 0)]
    y = make_seq("y", 7, priority=0, base=2000)
    sched.add(y)
    assert step(sched)[0] == [("x", 1, 7), ("y", 7, 0)]
    # x, first in running and the lowest priority, needs a third block: it is its own
    # victim and nothing is computed in this step, but its swap out must reach the ranks
    out = sched.schedule()
    assert out.scheduled == [] and out.preempted == [x] and not out.is_empty
    assert out.swap_out == [SwapOp("x", (0, 1), 8, TierSlot(0, 8))]


def test_abort_and_eviction_free_swapped_requests_slots():
    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    a, b = two_decoding(sched)
    sched.update(sched.schedule(), {"a": 102})
    assert sched.swap_slots.used_tokens == 8
    assert sched.abort("b") is b and b.status == SequenceStatus.FINISHED
    assert sched.swap_slots.used_tokens == 0 and sched.swap_slots.largest_free() == 64
    assert sched.abort("b") is None  # nothing freed twice

    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    a, b = two_decoding(sched)
    sched.update(sched.schedule(), {"a": 102})
    assert sched.evict_waiting() == [b]  # it leaves its KV behind: computed again elsewhere
    assert b.num_computed_tokens == 0 and sched.swap_slots.used_tokens == 0

    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    a, b = two_decoding(sched)
    sched.update(sched.schedule(), {"a": 102})
    assert sched.evict_all() == [a, b]
    assert b.num_computed_tokens == 0 and sched.swap_slots.used_tokens == 0


def test_preempted_with_a_pending_token_swaps_its_computed_tokens():
    """Async scheduling: b's chunk is in flight when it is preempted; the ranks finish that
    step before this one's swap out, so its KV is in the pages when they are copied."""
    sched = make_swap_scheduler(num_blocks=4, max_model_len=16)
    a, b = make_seq("a", 8, priority=0), make_seq("b", 8, priority=1)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    second = sched.schedule()  # a needs a third block at position 8: b is preempted
    assert second.preempted == [b] and b.num_pending_tokens == 1
    assert second.swap_out == [SwapOp("b", (2, 3), 8, TierSlot(0, 8))]
    sched.update(first, {"a": 10, "b": 11})
    sched.update(second, {"a": 12})
    assert b.output_token_ids == [11] and b.num_computed_tokens == 8
    assert sched.waiting == [b]
