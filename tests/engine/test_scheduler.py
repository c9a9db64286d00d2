import random

import pytest

from parashift.config import SchedulerConfig
from parashift.engine.scheduler import PLACEHOLDER_TOKEN, Scheduler
from parashift.engine.sequence import Sequence, SequenceStatus
from parashift.kv.block_manager import BlockManager
from parashift.sampling_params import SamplingParams

BS = 4
EOS = 0


def make_scheduler(num_blocks=64, caching=True, **config):
    config.setdefault("max_model_len", 64)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(SchedulerConfig(**config), bm, eos_token_ids={EOS})


def make_seq(request_id, num_tokens=None, token_ids=None, priority=0, base=1000, **params):
    params.setdefault("max_tokens", 100)
    if token_ids is None:
        token_ids = [base + i for i in range(num_tokens)]
    return Sequence(request_id, token_ids, SamplingParams(**params), priority=priority)


def fake_token(seq):
    """Deterministic: the k-th output token is 100 + k, whatever the step."""
    return 100 + seq.num_output_tokens


def step(sched, tokens=None):
    """One engine step; returns (scheduled (id, num_new, start_pos), preempted ids, finished ids)."""
    out = sched.schedule()
    sampled = {s.seq.request_id: fake_token(s.seq) for s in out.scheduled if s.samples}
    sampled.update(tokens or {})
    plan = [(s.seq.request_id, s.num_new_tokens, s.start_pos) for s in out.scheduled]
    preempted = [seq.request_id for seq in out.preempted]
    finished = [seq.request_id for seq in sched.update(out, sampled)]
    return plan, preempted, finished


@pytest.mark.parametrize("field, value", [
    ("max_num_seqs", 0), ("max_num_batched_tokens", 0), ("max_model_len", 0),
    ("long_prefill_token_threshold", -1), ("max_num_seqs", 2.5), ("max_model_len", True)])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{field: value})


def test_config_rejects_unknown_options():
    with pytest.raises(TypeError):
        SchedulerConfig(max_num_tokens=5)


def test_scheduler_rejects_pool_smaller_than_max_model_len():
    with pytest.raises(ValueError, match="max_model_len"):
        make_scheduler(num_blocks=3, max_model_len=13)


def test_add_rejects_empty_too_long_and_duplicate_requests():
    sched = make_scheduler(max_model_len=8)
    with pytest.raises(ValueError):
        sched.add(make_seq("a", 0))
    with pytest.raises(ValueError):
        sched.add(make_seq("a", 9))
    sched.add(make_seq("a", 8))
    with pytest.raises(ValueError):
        sched.add(make_seq("a", 3))


def test_chunked_prefill_schedules_budget_budget_rest():
    sched = make_scheduler(max_num_batched_tokens=4)
    seq = make_seq("a", 10)
    sched.add(seq)
    out = sched.schedule()
    assert [(s.num_new_tokens, s.start_pos, s.samples) for s in out.scheduled] == [(4, 0, False)]
    assert out.num_batched_tokens == 4
    assert sched.update(out, {}) == []
    assert seq.num_computed_tokens == 4 and seq.num_tokens == 10
    assert step(sched) == ([("a", 4, 4)], [], [])
    out = sched.schedule()
    assert [(s.num_new_tokens, s.start_pos, s.samples) for s in out.scheduled] == [(2, 8, True)]
    sched.update(out, {"a": 55})
    assert out.scheduled[0].samples  # still true after update appended the token
    assert seq.output_token_ids == [55]
    assert step(sched) == ([("a", 1, 10)], [], [])
    assert seq.block_table == [0, 1, 2]


def test_long_prefill_threshold_caps_one_requests_chunk():
    sched = make_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=3)
    sched.add(make_seq("a", 8))
    sched.add(make_seq("b", 2))
    assert step(sched)[0] == [("a", 3, 0), ("b", 2, 0)]
    assert step(sched)[0] == [("a", 3, 3), ("b", 1, 2)]
    assert step(sched)[0] == [("a", 2, 6), ("b", 1, 3)]
    assert step(sched)[0] == [("a", 1, 8), ("b", 1, 4)]


def test_decodes_and_a_prefill_chunk_share_one_step():
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add(make_seq("a", 3))
    sched.add(make_seq("b", 3))
    assert step(sched)[0] == [("a", 3, 0), ("b", 3, 0)]
    sched.add(make_seq("c", 10))
    assert step(sched)[0] == [("a", 1, 3), ("b", 1, 3), ("c", 6, 0)]
    assert step(sched)[0] == [("a", 1, 4), ("b", 1, 4), ("c", 4, 6)]
    assert step(sched)[0] == [("a", 1, 5), ("b", 1, 5), ("c", 1, 10)]


def test_budget_exhausted_by_running_leaves_waiting_and_running_tail_unscheduled():
    sched = make_scheduler(max_num_batched_tokens=5)
    sched.add(make_seq("a", 4))
    sched.add(make_seq("b", 4))
    assert step(sched)[0] == [("a", 4, 0), ("b", 1, 0)]
    sched.add(make_seq("c", 2))
    assert step(sched)[0] == [("a", 1, 4), ("b", 3, 1), ("c", 1, 0)]


def test_max_num_seqs_is_respected():
    sched = make_scheduler(max_num_seqs=2)
    sched.add(make_seq("a", 3, max_tokens=2))
    sched.add(make_seq("b", 3, max_tokens=5))
    sched.add(make_seq("c", 3))
    assert step(sched) == ([("a", 3, 0), ("b", 3, 0)], [], [])
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    assert step(sched) == ([("a", 1, 3), ("b", 1, 3)], [], ["a"])
    assert step(sched) == ([("b", 1, 4), ("c", 3, 0)], [], [])


def test_waiting_sequences_are_admitted_by_priority_then_arrival():
    sched = make_scheduler(max_num_seqs=2)
    sched.add(make_seq("low", 2, priority=1))
    sched.add(make_seq("high_first", 2, priority=0))
    sched.add(make_seq("high_second", 2, priority=0))
    assert [seq.request_id for seq in sched.waiting] == ["high_first", "high_second", "low"]
    assert step(sched)[0] == [("high_first", 2, 0), ("high_second", 2, 0)]


def test_most_urgent_is_the_lowest_priority_value_of_the_unfinished():
    sched = make_scheduler(max_num_seqs=1)
    assert sched.most_urgent() is None
    sched.add(make_seq("default", 2))
    sched.add(make_seq("urgent", 2, priority=-1))
    step(sched)  # admits one: the urgent; the other still waits and counts
    assert sched.most_urgent() == -1
    sched.abort("urgent")
    assert sched.most_urgent() == 0


def test_prefix_cache_hit_starts_after_cached_blocks():
    sched = make_scheduler()
    prompt = list(range(1, 11))
    sched.add(make_seq("a", token_ids=prompt, max_tokens=1))
    assert step(sched) == ([("a", 10, 0)], [], ["a"])
    b = make_seq("b", token_ids=prompt + [7, 7])
    sched.add(b)
    assert step(sched)[0] == [("b", 4, 8)]
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == [0, 1]


def test_preempts_lowest_priority_later_in_running_order():
    # pool of 4 blocks; a and b each fill 2 blocks after one decode
    sched = make_scheduler(num_blocks=4, max_model_len=16)
    a = make_seq("a", 7, max_tokens=4)
    b = make_seq("b", 7, max_tokens=4, base=2000)
    sched.add(a)
    sched.add(b)
    assert step(sched) == ([("a", 7, 0), ("b", 7, 0)], [], [])
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    assert step(sched) == ([("a", 1, 7), ("b", 1, 7)], [], [])
    # a needs a third block: b (same priority, later arrival) is the victim
    plan, preempted, _ = step(sched)
    assert (plan, preempted) == ([("a", 1, 8)], ["b"])
    assert a.block_table == [0, 1, 3]  # b's blocks were freed tail first: 3 then 2
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert b.status == SequenceStatus.WAITING and b.num_preemptions == 1
    assert b.token_ids == [2000 + i for i in range(7)] + [100, 101]
    # b's first block is still cached, but b needs 2 fresh blocks: not yet
    assert step(sched) == ([("a", 1, 9)], [], ["a"])
    # b comes back: its first block from the cache, the rest recomputed
    assert step(sched) == ([("b", 5, 4)], [], [])
    assert b.block_table == [2, 3, 1]
    assert step(sched) == ([("b", 1, 9)], [], ["b"])
    assert a.output_token_ids == b.output_token_ids == [100, 101, 102, 103]
    assert b.num_cached_tokens == 0  # set at first admission only
    assert sched.block_manager.num_free_blocks == 4


def test_preempting_an_already_scheduled_seq_unschedules_it():
    sched = make_scheduler(num_blocks=4, max_model_len=16, max_num_batched_tokens=16)
    low = make_seq("low", 8, priority=1)
    sched.add(low)
    assert step(sched)[0] == [("low", 8, 0)]
    high = make_seq("high", 4, priority=0)
    sched.add(high)
    assert step(sched)[0] == [("low", 1, 8), ("high", 4, 0)]
    assert (low.block_table, high.block_table) == ([0, 1, 2], [3])
    # low fits its decode in block 2; high needs a new block and evicts low
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos) for s in out.scheduled] == [
        ("high", 1, 4)]
    assert out.preempted == [low]
    assert out.num_batched_tokens == 1
    assert high.block_table == [3, 2]
    assert low.block_table == [] and low.status == SequenceStatus.WAITING


def test_self_preemption_stops_scheduling_running():
    sched = make_scheduler(num_blocks=4, max_model_len=16)
    x = make_seq("x", 5, priority=1)
    sched.add(x)
    assert step(sched)[0] == [("x", 5, 0)]
    y = make_seq("y", 5, priority=0, base=2000)
    sched.add(y)
    assert step(sched)[0] == [("x", 1, 5), ("y", 5, 0)]
    assert (x.block_table, y.block_table) == ([0, 1], [2, 3])
    assert step(sched)[0] == [("x", 1, 6), ("y", 1, 5)]
    assert step(sched)[0] == [("x", 1, 7), ("y", 1, 6)]
    # x (first in running, lowest priority) needs a third block: it is its own
    # victim, and y behind it is not scheduled in this step
    assert step(sched) == ([], ["x"], [])
    assert x.block_table == [] and x.num_computed_tokens == 0
    assert step(sched)[0] == [("y", 1, 7)]
    assert sched.num_running == 1 and sched.waiting == [x]


def test_last_running_seq_can_be_its_own_victim():
    sched = make_scheduler(num_blocks=4, max_model_len=16)
    a = make_seq("a", 7, priority=0)
    b = make_seq("b", 8, priority=1)
    sched.add(a)
    sched.add(b)
    assert step(sched)[0] == [("a", 7, 0), ("b", 8, 0)]
    # a's decode fits in its 2 blocks; b needs a third and is itself the lowest priority
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["a"]
    assert out.preempted == [b]
    assert b.block_table == [] and sched.block_manager.num_free_blocks == 2


def test_abort_frees_blocks_from_running_and_waiting():
    sched = make_scheduler(max_num_seqs=1)
    a, b = make_seq("a", 6), make_seq("b", 3)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.block_manager.num_used_blocks == 2
    assert sched.abort("a") is a
    assert a.status == SequenceStatus.FINISHED and a.finish_reason == "abort"
    assert a.block_table == [] and sched.block_manager.num_used_blocks == 0
    assert sched.abort("b") is b and sched.num_waiting == 0
    assert sched.abort("a") is None and sched.abort("nope") is None
    assert not sched.has_unfinished()


def test_seq_aborted_during_a_step_is_skipped_by_update():
    sched = make_scheduler()
    sched.add(make_seq("a", 3))
    out = sched.schedule()
    sched.abort("a")
    assert sched.update(out, {"a": 5}) == []
    assert out.scheduled[0].seq.output_token_ids == []


@pytest.mark.parametrize("params, tokens, reason, stop_reason", [
    ({}, [5, EOS], "stop", None),
    ({"stop_token_ids": [9]}, [5, 9], "stop", 9),
    ({"max_tokens": 3}, [5, 6, 7], "length", None),
    ({"ignore_eos": True, "max_tokens": 3}, [EOS, EOS, EOS], "length", None),
    ({"ignore_eos": True, "stop_token_ids": [EOS]}, [5, EOS], "stop", EOS),
])
def test_stop_reasons(params, tokens, reason, stop_reason):
    sched = make_scheduler()
    seq = make_seq("a", 3, **params)
    sched.add(seq)
    for i, token in enumerate(tokens):
        _, _, finished = step(sched, {"a": token})
        assert finished == (["a"] if i == len(tokens) - 1 else [])
    assert seq.output_token_ids == tokens
    assert (seq.finish_reason, seq.stop_reason) == (reason, stop_reason)
    assert seq.status == SequenceStatus.FINISHED and seq.block_table == []
    assert sched.running == [] and not sched.has_unfinished()


def test_max_model_len_stops_with_length():
    sched = make_scheduler(max_model_len=6)
    seq = make_seq("a", 4)
    sched.add(seq)
    assert step(sched)[2] == []
    assert step(sched)[2] == ["a"]
    assert seq.num_tokens == 6 and seq.finish_reason == "length"


def test_prompt_at_max_model_len_gets_one_token():
    sched = make_scheduler(max_model_len=8)
    seq = make_seq("a", 8)
    sched.add(seq)
    assert step(sched) == ([("a", 8, 0)], [], ["a"])
    assert seq.num_output_tokens == 1 and seq.finish_reason == "length"


def test_finish_for_a_stop_string():
    sched = make_scheduler()
    seq = make_seq("a", 5)
    sched.add(seq)
    step(sched)
    sched.finish(seq, "stop", "###")
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "###")
    assert sched.running == [] and sched.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("caching", [True, False])
def test_random_workload_under_a_tiny_pool_finishes_every_request_intact(caching):
    rng = random.Random(caching)
    sched = make_scheduler(num_blocks=8, max_model_len=32, caching=caching,
                           max_num_batched_tokens=12, max_num_seqs=4)
    seqs = []
    for i in range(20):
        prompt = [rng.randrange(1, 4) for _ in range(rng.randrange(1, 20))]
        seqs.append(make_seq(f"r{i}", token_ids=prompt, priority=rng.randrange(3),
                             max_tokens=rng.randrange(1, 10)))
    pending = list(seqs)
    num_preemptions = 0
    for _ in range(1000):
        if pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        out = sched.schedule()
        scheduled_ids = [id(s.seq) for s in out.scheduled]
        assert len(set(scheduled_ids)) == len(scheduled_ids)
        assert not set(scheduled_ids) & {id(seq) for seq in out.preempted}
        assert all(s.num_new_tokens > 0 for s in out.scheduled)
        assert out.num_batched_tokens <= 12 and sched.num_running <= 4
        num_preemptions += len(out.preempted)
        sched.update(out, {s.seq.request_id: fake_token(s.seq) for s in out.scheduled if s.samples})
        if not pending and not sched.has_unfinished():
            break
    assert not sched.has_unfinished()
    assert num_preemptions > 0
    for seq in seqs:
        expected = [100 + k for k in range(min(seq.params.max_tokens, 32 - seq.num_prompt_tokens))]
        assert seq.output_token_ids == expected
    assert sched.block_manager.num_free_blocks == 8
    assert all(count == 0 for count in sched.block_manager.ref_counts)


def test_next_step_scheduled_before_results_carries_a_placeholder():
    sched = make_scheduler()
    seq = make_seq("a", 5, max_tokens=3)
    sched.add(seq)
    first = sched.schedule()
    assert [(s.num_new_tokens, s.start_pos, s.samples) for s in first.scheduled] == [(5, 0, True)]
    second = sched.schedule()  # the first step is still running
    assert [(s.num_new_tokens, s.start_pos, s.samples) for s in second.scheduled] == [(1, 5, True)]
    assert second.scheduled[0].token_ids() == [PLACEHOLDER_TOKEN]
    assert seq.num_pending_tokens == 2 and seq.block_table == [0, 1]
    assert sched.update(first, {"a": 55}) == []
    third = sched.schedule()  # its input is the second step's pending token
    assert [(s.num_new_tokens, s.start_pos) for s in third.scheduled] == [(1, 6)]
    assert third.scheduled[0].token_ids() == [PLACEHOLDER_TOKEN]
    assert sched.update(second, {"a": 56}) == []
    # max_tokens=3: the third step's token is the last; nothing is scheduled after it
    assert sched.schedule().is_empty
    assert [s.request_id for s in sched.update(third, {"a": 57})] == ["a"]
    assert seq.output_token_ids == [55, 56, 57] and seq.finish_reason == "length"
    assert sched.block_manager.num_free_blocks == 64


def test_defer_pending_schedules_no_placeholder_and_keeps_chunking_the_others():
    """A pipeline's steps in flight (defer_pending): a sequence whose token is on its way
    waits for it; another's prompt chunks go on, and new requests are admitted."""
    sched = make_scheduler(max_num_batched_tokens=8, long_prefill_token_threshold=4)
    sched.defer_pending = True
    a, b, c = make_seq("a", 3), make_seq("b", 10), make_seq("c", 2)
    for seq in (a, b):
        sched.add(seq)
    first = sched.schedule()  # a whole (it samples), b's first chunk of 4
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos, s.samples)
            for s in first.scheduled] == [("a", 3, 0, True), ("b", 4, 0, False)]
    sched.add(c)
    second = sched.schedule()  # first in flight: a waits; b's next chunk; c admitted
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos, s.samples)
            for s in second.scheduled] == [("b", 4, 4, False), ("c", 2, 0, True)]
    assert all(PLACEHOLDER_TOKEN not in s.token_ids() for s in (*first.scheduled,
                                                                 *second.scheduled))
    assert sched.update(first, {"a": 55}) == []
    third = sched.schedule()  # a's token is known now: a decodes from it
    assert [(s.seq.request_id, s.num_new_tokens, s.start_pos) for s in third.scheduled] == [
        ("a", 1, 3), ("b", 2, 8)]
    assert third.scheduled[0].token_ids() == [55]


def test_step_after_a_stop_is_discarded():
    sched = make_scheduler()
    seq = make_seq("a", 3)
    sched.add(seq)
    first, second = sched.schedule(), sched.schedule()
    assert [s.request_id for s in sched.update(first, {"a": EOS})] == ["a"]
    assert sched.update(second, {"a": 77}) == []  # computed past the stop: dropped
    assert seq.output_token_ids == [EOS] and seq.finish_reason == "stop"
    assert sched.block_manager.num_free_blocks == 64


def test_preempted_with_a_pending_token_waits_for_it():
    # 4 blocks of 4 tokens: b (lower priority) is preempted while its token is pending
    sched = make_scheduler(num_blocks=4, max_model_len=16)
    a, b = make_seq("a", 8, priority=0), make_seq("b", 8, priority=1)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("a", 8), ("b", 8)]
    second = sched.schedule()  # a needs a third block at position 8: b is preempted
    assert [(s.seq.request_id, s.num_new_tokens) for s in second.scheduled] == [("a", 1)]
    assert second.preempted == [b] and b.num_pending_tokens == 1
    assert a.block_table == [0, 1, 3]  # b freed its tail block first
    sched.update(first, {"a": 10, "b": 11})
    assert b.output_token_ids == [11] and b.num_pending_tokens == 0
    assert b.status == SequenceStatus.WAITING and b.num_computed_tokens == 0


def test_counters_predict_the_next_step_without_changing_anything():
    sched = make_scheduler(max_num_batched_tokens=16, max_num_seqs=3)
    sched.add(make_seq("a", 10))
    sched.add(make_seq("b", 9, priority=-1))
    c = sched.counters()
    assert (c.num_waiting, c.num_running, c.tokens_waiting) == (2, 0, 19)
    assert c.next_step_tokens == 16 and c.priorities == (-1, 0) and c.longest_context == 0
    assert sched.counters() == c  # nothing moved
    assert step(sched)[0] == [("b", 9, 0), ("a", 7, 0)]
    sched.add(make_seq("c", 30, base=3000))
    sched.add(make_seq("d", 5, base=4000))
    c = sched.counters()
    # b decodes (1), a finishes its prompt (3), one seat left: c fills the budget (12), d waits
    assert (c.num_waiting, c.num_running, c.tokens_waiting) == (2, 2, 35)
    assert c.next_step_tokens == 16 and c.longest_context == 10
    out = sched.schedule()
    assert out.num_batched_tokens == c.next_step_tokens


def test_evict_all_hands_every_request_over_with_its_blocks_freed():
    """A merge or split: every request leaves, in scheduling order, to be computed again."""
    sched = make_scheduler(num_blocks=8, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=32)
    for rid, n, priority in (("a", 6, 1), ("b", 3, 0), ("c", 5, 0)):
        sched.add(make_seq(rid, n, priority=priority))
    assert step(sched)[0] == [("b", 3, 0), ("c", 5, 0)]
    assert [s.block_table for s in sched.running] == [[0], [1, 2]]
    evicted = sched.evict_all()
    assert [s.request_id for s in evicted] == ["b", "c", "a"]
    assert [s.num_tokens for s in evicted] == [4, 6, 6]  # prompt and the token it got
    assert all(s.num_computed_tokens == 0 and s.block_table == [] for s in evicted)
    assert [s.num_preemptions for s in evicted] == [1, 1, 0]  # "a" had computed nothing
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 8
    other = make_scheduler(num_blocks=8, max_num_seqs=3, max_num_batched_tokens=64, max_model_len=32)
    for seq in evicted:
        other.add(seq)
    assert step(other)[0] == [("b", 4, 0), ("c", 6, 0), ("a", 6, 0)]


def test_the_length_limit_is_max_tokens_or_the_model_length_whichever_comes_first():
    sched = make_scheduler(max_model_len=20)
    seqs = [make_seq("a", 10, max_tokens=5), make_seq("b", 10, max_tokens=30),
            make_seq("c", 10, max_tokens=None), make_seq("d", 10, max_tokens=10)]
    for seq in seqs:
        sched.add(seq)
    assert [seq.length_limit for seq in seqs] == [15, 20, 20, 20]
    finished_at = {}
    for n in range(1, 12):
        for seq in step(sched)[2]:
            finished_at[seq] = n
    assert finished_at == {"a": 5, "b": 10, "c": 10, "d": 10}
    assert [seq.finish_reason for seq in seqs] == ["length"] * 4
    assert [seq.num_output_tokens for seq in seqs] == [5, 10, 10, 10]


@pytest.mark.parametrize("defer", [False, True])
def test_each_running_chunk_is_what_num_new_tokens_says_with_steps_in_flight(defer):
    """The running loop tells decodes apart without `_num_new_tokens`: with a budget that
    never binds, every running sequence gets that method's answer (as asked before the
    step), and samples exactly when its chunk reaches its last token, pending ones included:
    random prompts, length limits and a prefill threshold, two steps in flight."""
    rng = random.Random(3)
    sched = make_scheduler(num_blocks=512, max_num_batched_tokens=4096,
                           long_prefill_token_threshold=8)
    sched.defer_pending = defer
    for i in range(10):
        sched.add(make_seq(f"s{i}", rng.randint(1, 30), max_tokens=rng.randint(1, 7)))
    in_flight, decodes = [], 0
    for _ in range(40):
        asked = {seq.request_id: (sched._num_new_tokens(seq, 4096, seq.num_computed_tokens),
                                  len(seq.token_ids) + seq.num_pending_tokens)
                 for seq in sched.running}
        out = sched.schedule()
        for s in out.scheduled:
            if s.seq.request_id not in asked:  # admitted in this step
                continue
            num_new, end = asked.pop(s.seq.request_id)
            assert (s.num_new_tokens, s.samples) == (num_new, s.start_pos + num_new == end)
            decodes += s.num_new_tokens == 1 and s.samples
        assert all(num_new <= 0 for num_new, _ in asked.values())  # the ones left out
        in_flight.append(out)
        if len(in_flight) == 2 or not out.scheduled:
            done = in_flight.pop(0)
            sched.update(done, [7] * sum(s.samples for s in done.scheduled))
    assert decodes > 20


def test_without_chunked_prefill_a_prompt_waits_for_a_step_that_holds_it_whole():
    chunked = make_scheduler(max_num_batched_tokens=16, max_model_len=16)
    whole = make_scheduler(max_num_batched_tokens=16, max_model_len=16,
                           enable_chunked_prefill=False)
    for sched in (chunked, whole):
        sched.add(make_seq("a", 10))
        sched.add(make_seq("b", 10, base=2000))
    assert step(chunked)[0] == [("a", 10, 0), ("b", 6, 0)]  # b's prompt cut
    assert step(whole)[0] == [("a", 10, 0)]  # b waits: 6 tokens of budget left
    assert step(whole)[0] == [("a", 1, 10), ("b", 10, 0)]


def test_scheduler_config_takes_chunked_prefill_as_a_boolean():
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        SchedulerConfig(enable_chunked_prefill=1)


def test_a_deferred_sequence_waits_for_its_token_to_draft_while_others_decode_ahead():
    """Async scheduling with speculation: a sequence the speculator defers (it drafts
    next) is left out of the step scheduled ahead, while the others' decodes take their
    placeholders (in columns, and in the loop of a step with drafts); once its token is
    known its verification starts from it, and while the verification runs the sequence
    is not scheduled (its 1..k+1 tokens are unknown)."""
    sched = make_scheduler()
    a, b, c = make_seq("a", 5), make_seq("b", 5, base=2000), make_seq("c", 5, base=3000)
    for seq in (a, b, c):
        sched.add(seq)
    first = sched.schedule()
    sched.deferred = {a}
    assert sched.counters().next_step_tokens == 2  # what the policy sees: b's and c's
    second = sched.schedule()  # first in flight: a waits, b and c decode ahead
    assert [(s.seq.request_id, s.start_pos, s.token_ids()) for s in second.scheduled] == [
        ("b", 5, [PLACEHOLDER_TOKEN]), ("c", 5, [PLACEHOLDER_TOKEN])]
    assert not sched.deferred  # taken by the step
    assert sched.update(first, {"a": 55, "b": 66, "c": 76}) == []
    a.spec_token_ids, sched.draft_tokens, sched.deferred = [7, 8], 2, {c}
    third = sched.schedule()  # second in flight: a verifies from its own token, c waits
    assert [(s.seq.request_id, s.start_pos, s.token_ids(), s.num_samples)
            for s in third.scheduled] == [("a", 5, [55, 7, 8], 3),
                                          ("b", 6, [PLACEHOLDER_TOKEN], 1)]
    sched.deferred = {b, c}
    assert sched.schedule().is_empty  # a's verification in flight, b and c wait
    assert sched.update(second, {"b": 67, "c": 77}) == []
    assert sched.update(third, {"a": [7, 8, 60], "b": 68}) == []
    assert a.output_token_ids == [55, 7, 8, 60] and b.output_token_ids == [66, 67, 68]
    assert (a.num_computed_tokens, a.num_pending_tokens) == (len(a.token_ids) - 1, 0)
    fourth = sched.schedule()
    assert [(s.seq.request_id, s.token_ids()) for s in fourth.scheduled] == [
        ("a", [60]), ("b", [68]), ("c", [77])]
