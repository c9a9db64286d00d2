"""An online forecast from the requests' arrival times (cost/forecast_trace.py): prompts
queue per replica and share a step while they wait, a burst's requests decode in the batch
the burst makes; the hint's trace from a workload file; on the committed H200 profiles the
8-GPU `bursty` start-up choice the mean rate got wrong."""
import json
import math

import pytest

from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from parashift.cost.advisor import Advisor
from parashift.cost.forecast import predict_online, predict_trace
from parashift.cost.forecast_trace import Busy, _queued_prefills, trace_figures
from parashift.cost.plan_choice import choose
from parashift.cost.runs import Engine, Served
from parashift.cost.shape import load_shape
from parashift.cost.step import StepModel
from parashift.cost.workload_hint import WorkloadHint, hint_of, load_lengths
from parashift.parallel.plan import Plan
from parashift.planner.recommend import node_model
from tests.cost.test_step import SHAPE, compute


def test_busy_spans_give_the_share_of_a_window_they_fill():
    busy = Busy([(1.0, 2.0), (3.0, 3.5)])
    assert busy.share(0.0, 4.0) == pytest.approx(1.5 / 4)
    assert busy.share(1.5, 3.25) == pytest.approx((0.5 + 0.25) / 1.75)
    assert busy.share(2.0, 3.0) == 0.0 and busy.share(5.0, 5.0) == 0.0
    assert busy.mean_step == pytest.approx(0.75)


def test_waiting_prompts_share_a_step_up_to_the_budget_and_a_late_one_waits_for_none():
    """One replica: three prompts at t=0 (a step takes what waits when it starts: the first
    two, 300 + 300 <= 600 tokens; the third the next step), one at t=10 after the queue
    has drained."""
    def prefill(prompts):
        return 1.0 if len(prompts) == 1 else 1.5
    arrivals = (0.0, 0.0, 0.0, 10.0)
    order = [0, 1, 2, 3]
    ttft, busy = _queued_prefills(order, {i: 0 for i in order}, arrivals, [300] * 4, 600,
                                  prefill, 0.1)
    assert ttft == pytest.approx([1.6, 1.6, 2.6, 1.1])
    assert busy[0].spans == [(0.0, 1.5), (1.5, 2.5), (10.0, 11.0)]
    steps = []

    def chunked(chunks):  # (tokens, tokens before them) of each prompt in the step
        steps.append(chunks)
        return prefill(chunks)
    over = _queued_prefills(order, {i: 0 for i in order}, arrivals, [300] * 4, 500, chunked,
                            0.0)[0]
    # a 500-token budget: 300 + the second's first 200, then its last 100 + the third's 300
    assert steps[:2] == [((200, 0), (300, 0)), ((100, 200), (300, 0))]
    assert over == pytest.approx([1.5, 3.0, 3.0, 1.0])


def test_a_burst_batches_more_than_the_same_requests_spread_at_the_same_mean_rate():
    model = StepModel(SHAPE, compute(hbm_bytes_per_s=1e7, matmul_flops=1e10))  # ~20 ms steps
    served, engine = Served(Plan()), Engine(max_num_batched_tokens=64)
    reqs = [(16, 40)] * 20
    spread = tuple(i * 10 / 19 for i in range(20))
    bursts = tuple([0.01 * i for i in range(10)] + [10 - 0.01 * i for i in range(10)])
    even, bursty = (trace_figures(model, served, reqs, t, engine) for t in (spread, bursts))
    assert even.rate == bursty.rate == pytest.approx(1.9)
    assert bursty.decode_batch > even.decode_batch and bursty.ttft_s > even.ttft_s
    assert bursty.tpot_s > even.tpot_s
    mean_rate = predict_online(model, served, reqs, even.rate, engine)
    assert mean_rate.detail["decode_batch"] < bursty.decode_batch
    # online plans rank by a request's latency: from a trace, its requests' median
    assert predict_trace(model, served, reqs, bursts, engine).score(False, 40) == bursty.latency_s
    with pytest.raises(ValueError, match="one time a request"):
        trace_figures(model, served, reqs, spread[:3], engine)


def test_a_workload_file_of_triples_is_a_trace_and_gives_its_rate(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([[100, 10, 0.0], [200, 20, 1.5], [300, 30, 2.0]]))
    assert load_lengths(str(path)) == (((100, 10), (200, 20), (300, 30)), (0.0, 1.5, 2.0))
    options = dict(mean_prompt_tokens=None, mean_output_tokens=None, num_requests=None,
                   workload_file=str(path))
    hint = hint_of(type("Options", (), {**options, "request_rate": None})())
    assert hint.arrivals == (0.0, 1.5, 2.0) and hint.request_rate == pytest.approx(1.0)
    assert not hint.offline
    path.write_text(json.dumps([[100, 10, 0.0], [200, 20, 0.0]]))  # all at t=0: offline
    hint = hint_of(type("Options", (), {**options, "request_rate": None})())
    assert hint.offline and hint.arrivals == ()
    path.write_text(json.dumps([[100, 10, 0.0], [200, 20]]))
    with pytest.raises(ValueError, match=r"\[prompt_tokens, output_tokens, arrival_s\]"):
        load_lengths(str(path))
    with pytest.raises(ValueError, match="one a request: 1 times for 2 requests"):
        WorkloadHint(100, 10, request_rate=1.0, lengths=((100, 10), (100, 10)), arrivals=(0.0,))


@pytest.fixture(scope="module")
def bursty_8b():
    """`bursty` as benchmarks/policy_vs_static.py runs it (lengths x 0.25, time x 0.05)."""
    requests = build_phases(get_workload("bursty"), WorkloadOptions(
        length_scale=0.25, time_scale=0.05))[0].requests
    lengths = tuple((r.input_len, r.output_len) for r in requests)
    arrivals = tuple(r.arrival_s for r in requests)
    rate = (len(arrivals) - 1) / (max(arrivals) - min(arrivals))
    means = (round(sum(i for i, _ in lengths) / len(lengths)),
             round(sum(o for _, o in lengths) / len(lengths)))
    return node_model(load_shape("llama-3.1-8b"), 8, "h200"), means, lengths, arrivals, rate


def test_on_eight_gpus_the_bursts_choose_dp2_x_tp4_where_the_mean_rate_chose_tp8(bursty_8b):
    """Simulated (benchmarks/policy_vs_static.py): median E2E DP2xTP4 207.1 ms, TP8 213.0
    ms. The mean rate's queue batches fewer requests than a burst does and ranks TP8 first;
    the trace ranks DP2xTP4 first."""
    model, (prompt, output), lengths, arrivals, rate = bursty_8b
    engine = Engine(max_num_batched_tokens=8192)
    told_rate = WorkloadHint(prompt, output, len(lengths), rate, lengths)
    assert choose(model, [], told_rate, 8, engine).best.name == "tp8"
    told_trace = WorkloadHint(prompt, output, len(lengths), rate, lengths, arrivals)
    table = choose(model, [], told_trace, 8, engine).table
    assert [p.name for p in table[:2]] == ["dp2xtp4", "tp8"]
    assert table[0].detail["trace"] and not math.isinf(table[0].ttft_s)


def test_under_sidp_any_replicas_prefill_holds_the_round():
    union = Busy.union([Busy([(0.0, 1.0), (4.0, 5.0)]), Busy([(0.5, 2.0)])])
    assert union.spans == [(0.0, 2.0), (4.0, 5.0)]
    assert union.share(0.0, 5.0) == pytest.approx(3 / 5)


def test_on_four_gpus_the_bursts_keep_tp4_ahead_of_sidp(bursty_8b):
    """Simulated: median E2E TP4 241.5 ms, SiDP over DP4 315.5 ms (its CaS rounds wait for
    every replica's prefill): the trace ranks TP4 first and SiDP behind DP2xTP2 and, with
    its eager prompt rounds' exchanges priced (cas_kernels_per_peer), behind plain DP4."""
    _, (prompt, output), lengths, arrivals, rate = bursty_8b
    model = node_model(load_shape("llama-3.1-8b"), 4, "h200")
    sidp = Served.sidp(Plan(dp=4), Advisor(model).sidp_crossover(1, 4))
    hint = WorkloadHint(prompt, output, len(lengths), rate, lengths, arrivals)
    choice = choose(model, [sidp], hint, 4, Engine(max_num_batched_tokens=8192))
    names = [p.name for p in choice.table]
    assert choice.static and names[:3] == ["tp4", "dp2xtp2", "dp4"]
    assert names.index("sidp-dp4") > names.index("dp4")
