"""Benchmark arithmetic on hand-made records: percentiles, goodput, timeline, plans."""
import pytest

from parashift.bench.client import RequestRecord
from parashift.bench.runner import PhaseResult
from parashift.bench.report import build_timeline
from parashift.bench.server_metrics import ServerSample, parse_sample, plan_per_interval
from parashift.bench.stats import SLO, distribution_ms, format_summary, summarize
from parashift.bench.workloads import Phase


def record(index, start, first, end, tokens, chunks=None, success=True):
    chunks = chunks if chunks is not None else [first + (end - first) * i / max(tokens - 1, 1)
                                                for i in range(tokens)]
    return RequestRecord(index, 10, tokens, start, start_s=start, first_token_s=first,
                         end_s=end, chunk_times=chunks, prompt_tokens=10, output_tokens=tokens,
                         finish_reason="length", success=success,
                         error=None if success else "HTTP 500: boom")


def test_record_latencies():
    r = record(0, 1.0, 1.5, 3.5, 5)
    assert r.ttft == pytest.approx(0.5) and r.e2e == pytest.approx(2.5)
    assert r.tpot == pytest.approx(0.5) and r.itls == pytest.approx([0.5] * 4)


def test_distribution_ms():
    d = distribution_ms([0.001 * i for i in range(1, 101)])
    assert d["mean"] == pytest.approx(50.5) and d["median"] == pytest.approx(50.5)
    assert d["p90"] == pytest.approx(90.1) and d["p99"] == pytest.approx(99.01)
    assert distribution_ms([])["mean"] is None


def test_summarize_and_goodput():
    records = [record(0, 0.0, 0.1, 1.1, 11), record(1, 0.0, 0.9, 1.9, 11),
               record(2, 0.0, 0.2, 3.2, 11), record(3, 0.0, 0.0, 0.5, 0, success=False)]
    summary = summarize(records, 4.0, SLO.parse("ttft:500,tpot:150"))
    assert summary["completed"] == 3 and summary["failed"] == 1
    assert summary["output_tokens"] == 33 and summary["input_tokens"] == 30
    assert summary["request_throughput"] == pytest.approx(0.75)
    assert summary["total_token_throughput"] == pytest.approx(63 / 4)
    # request 1 misses the TTFT limit, request 2 the TPOT limit (300 ms), 3 failed
    assert summary["goodput"] == pytest.approx(0.25)
    assert summary["ttft_ms"]["median"] == pytest.approx(200)
    assert summary["errors"] == ["HTTP 500: boom"]


def test_priority_requests_summarized_apart():
    records = [record(0, 0.0, 0.1, 1.1, 11), record(1, 0.0, 0.9, 1.9, 11),
               record(2, 0.0, 0.3, 0.8, 0, success=False)]
    assert "priority" not in summarize(records, 2.0, None)
    records[1].priority = records[2].priority = -1
    summary = summarize(records, 2.0, None)
    assert summary["priority"]["completed"] == 1  # the failed one is not counted
    assert summary["priority"]["ttft_ms"]["median"] == pytest.approx(900)
    assert summary["priority"]["tpot_ms"]["median"] == pytest.approx(100)
    assert summary["ttft_ms"]["median"] == pytest.approx(500)
    assert "prio TTFT" in format_summary("priority", summary)


@pytest.mark.parametrize("text, expected", [("ttft:500,tpot:50", SLO(500, 50)),
                                            ("tpot:20", SLO(None, 20)), (None, None)])
def test_slo_parse(text, expected):
    assert SLO.parse(text) == expected


@pytest.mark.parametrize("text", ["ttft=5", "e2e:4", "ttft:-1"])
def test_slo_parse_errors(text):
    with pytest.raises(ValueError):
        SLO.parse(text)


def test_parse_prometheus_sample():
    text = ('parashift_steps_total{model_name="m",plan="tp2"} 7.0\n'
            'parashift_steps_total{model_name="m",plan="sp2"} 3.0\n'
            'parashift_num_requests_running{model_name="m"} 4.0\n'
            'parashift_num_requests_waiting{model_name="m"} 1.0\n')
    sample = parse_sample(text, 1.5)
    assert sample.steps_by_plan == {"tp2": 7.0, "sp2": 3.0}
    assert (sample.running, sample.waiting, sample.t) == (4.0, 1.0, 1.5)


def test_parse_transitions():
    text = ('parashift_transition_duration_seconds_count{kind="reshard",model_name="m",'
            'phase="cutover"} 3.0\n'
            'parashift_transition_duration_seconds_count{kind="reshard",model_name="m",'
            'phase="drain"} 3.0\n'
            'parashift_transition_duration_seconds_sum{kind="reshard",model_name="m",'
            'phase="drain"} 0.25\n'
            'parashift_transition_duration_seconds_sum{kind="reshard",model_name="m",'
            'phase="cutover"} 0.05\n')
    sample = parse_sample(text, 0.0)
    assert sample.transitions == 3.0 and sample.transition_s == pytest.approx(0.3)


def test_plan_per_interval_picks_the_busiest_plan():
    samples = [ServerSample(0.0, {"sp2": 0, "tp2": 0}), ServerSample(1.0, {"sp2": 9, "tp2": 1}),
               ServerSample(2.0, {"sp2": 9, "tp2": 6}), ServerSample(3.0, {"sp2": 9, "tp2": 6})]
    assert plan_per_interval(samples, [0, 1, 2, 3]) == ["sp2", "tp2", ""]


def test_timeline_rows():
    records = [record(0, 0.0, 0.5, 1.5, 3), record(1, 1.0, 1.2, 2.5, 4)]
    result = PhaseResult(Phase("t0", None, []), records, 3.0,
                         [ServerSample(0.0, {"a": 0}), ServerSample(3.0, {"a": 5})], None)
    rows = build_timeline(result, 1.0)
    assert [row["t_s"] for row in rows] == [0.0, 1.0, 2.0]
    assert sum(row["started"] for row in rows) == 2 and sum(row["finished"] for row in rows) == 2
    assert sum(row["output_tok_per_s"] for row in rows) == pytest.approx(7)
    assert rows[0]["in_flight"] == pytest.approx(1.0) and rows[1]["in_flight"] == pytest.approx(1.5)
    assert rows[0]["ttft_median_ms"] == pytest.approx(500)


def test_timeline_marks_transitions(tmp_path):
    import matplotlib.pyplot as plt
    from parashift.bench import plot
    records = [record(0, 0.0, 0.5, 1.5, 3)]
    samples = [ServerSample(0.0, {"sp2": 0}), ServerSample(1.0, {"sp2": 4}, transitions=1.0),
               ServerSample(2.0, {"sp2": 5, "shift-tp2": 3}, transitions=2.0)]
    result = PhaseResult(Phase("t0", None, []), records, 3.0, samples, None)
    rows = build_timeline(result, 1.0)
    assert [row["transitions"] for row in rows] == [1.0, 2.0, 2.0]
    fig, axes = plt.subplots(2, 1)
    plot._transitions(axes, rows)
    assert [[line.get_xdata()[0] for line in ax.lines] for ax in axes] == [[0.0, 1.0]] * 2
    plt.close(fig)
    plot.plot_timeline(result, rows, tmp_path / "timeline.png", "t")
    assert (tmp_path / "timeline.png").exists()
