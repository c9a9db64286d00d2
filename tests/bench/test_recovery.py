"""parashift/bench/recovery.py: the kill-under-load report from recorded streams and fault
reports (synthetic timelines; the real run: test_recovery_under_load.py)."""
from parashift.bench.recovery import (FaultSample, Trace, analyse, longest_gap, loss_seen,
                                      serving_again, tokens_between)


def trace(request_id, ranks, times, max_tokens=None, status="completed"):
    steps = [(t, i + 1) for i, t in enumerate(times)]
    return Trace(request_id, max_tokens or len(times), ranks, steps, status)


SAMPLES = [FaultSample(0.0, 2, ()), FaultSample(10.3, 1, ((1,),)),
           FaultSample(11.0, 2, ((1,),)), FaultSample(12.0, 2, ())]


def test_loss_and_recovery_are_the_first_reports_after_the_kill():
    seen = loss_seen(SAMPLES, kill_at=10.0)
    assert seen.time == 10.3
    # ranks alive again at 11.0, but the group is still out until 12.0
    assert serving_again(SAMPLES, seen, world=2).time == 12.0
    assert serving_again(SAMPLES[:3], seen, world=2) is None
    assert loss_seen(SAMPLES[:1], kill_at=10.0) is None


def test_tokens_and_gaps_are_counted_inside_their_window():
    a = trace("a", (0,), [1.0, 2.0, 2.5, 6.0])
    b = trace("b", (0,), [1.5, 3.0])
    assert tokens_between([a, b], 2.0, 3.0) == 2  # a's 3rd (2.5) and b's 2nd (3.0)
    assert tokens_between([a, b], 0.0, 10.0) == 6
    assert longest_gap([a, b], 3.0, 4.0) == (3.5, "a")  # 2.5 -> 6.0 overlaps [3, 4]
    assert longest_gap([a, b], 0.0, 1.9) == (1.5, "b")  # 1.0 -> 2.0 is 1.0, 1.5 -> 3.0 is 1.5
    assert longest_gap([a], 6.5, 9.0) == (0.0, None)


def test_analysis_splits_survivors_from_the_lost_group():
    survivor = trace("s", (0,), [9.0, 9.5, 10.0, 10.8, 11.2, 12.5, 13.0])
    lost = trace("l", (1,), [9.2, 9.8, 13.5])  # re-queued: computed again elsewhere
    failed = Trace("f", 5, (1,), [(9.1, 1)], "failed", "RequestFailedError: no group left")
    ended = trace("e", None, [8.5, 9.0])
    report = analyse([survivor, lost, failed, ended], SAMPLES, kill_at=10.0, killed_rank=1,
                     world=2, start=8.0, window_s=2.0)
    assert report["requests"]["completed"] == 3 and report["requests"]["failed"] == 1
    assert report["requests"]["failures"] == [{"request": "f",
                                               "error": "RequestFailedError: no group left"}]
    assert report["detection_s"] == 0.3 and report["serving_again_s"] == 2.0
    assert report["lost_ranks"] == [1] and report["requests_on_lost_group"] == 2
    assert report["requests_on_lost_group_completed"] == 1
    assert report["ended_before_kill"] == 1
    assert report["survivors_longest_stall_s"] == 1.3  # 11.2 -> 12.5, in [10, 12]
    assert report["survivors_longest_gap_before_s"] == 0.5
    assert report["survivors_longest_gap_after_s"] == 1.3  # 11.2 -> 12.5 again, in [12, 14]
    assert report["lost_group_longest_gap_s"] == 3.7
    tp = report["throughput"]
    assert (tp["before"]["start_s"], tp["before"]["end_s"]) == (0.5, 2.0)  # from the first token
    # in (8.5, 10]: s at 9.0, 9.5, 10.0; l at 9.2, 9.8; f at 9.1; e at 9.0
    assert tp["before"]["output_tokens"] == 7
    assert tp["during"]["output_tokens"] == 2 and tp["during"]["seconds"] == 2.0
    assert tp["after"]["end_s"] == 5.5 and tp["after"]["output_tokens"] == 3


def test_analysis_without_recovery_has_no_after_window():
    survivor = trace("s", (0,), [9.0, 10.5, 11.0])
    report = analyse([survivor], SAMPLES[:2], kill_at=10.0, killed_rank=1, world=2, start=8.0)
    assert report["serving_again_s"] is None and report["throughput"]["after"] is None
    assert report["survivors_longest_gap_after_s"] is None
    # back after the last token: no window after
    ended = analyse([survivor], SAMPLES, kill_at=10.0, killed_rank=1, world=2, start=8.0)
    assert ended["serving_again_s"] == 2.0 and ended["throughput"]["after"] is None
    assert report["throughput"]["during"]["end_s"] == 3.0  # to the last token


def test_the_returned_group_is_read_from_where_requests_were_once_it_served():
    moved = trace("m", (0,), [9.0, 11.5, 12.4, 12.6])  # moved to rank 1 when it came back
    moved.ranks_after = (1,)
    stayed = trace("s", (0,), [9.0, 12.2])
    stayed.ranks_after = (0,)
    report = analyse([moved, stayed], SAMPLES, kill_at=10.0, killed_rank=1, world=2, start=8.0)
    assert report["requests_on_returned_group"] == 1
    assert report["returned_group_first_output_s"] == 2.4  # 12.4: the first after 12.0
