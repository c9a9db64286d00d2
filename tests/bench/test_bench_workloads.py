"""Workloads are seeded and shaped as workloads.md says."""
import numpy as np
import pytest

from parashift.bench.arrivals import BurstyPattern, gamma_arrivals
from parashift.bench.client import Endpoint
from parashift.bench.prompts import fill_text_prompts, fill_token_prompts
from parashift.bench.workloads import (URGENT, WORKLOADS, WorkloadOptions, build_phases,
                                       get_workload, sample_lengths)


def lengths_of(name, **options):
    phases = build_phases(get_workload(name), WorkloadOptions(**options))
    return [[(r.input_len, r.output_len, r.arrival_s) for r in p.requests] for p in phases]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_requests(name):
    small = dict(num_requests=50, time_scale=0.05)
    assert lengths_of(name, seed=3, **small) == lengths_of(name, seed=3, **small)


def test_other_seed_other_requests():
    assert lengths_of("chat", seed=0) != lengths_of("chat", seed=1)


def test_chat_lengths_and_arrivals():
    phase = build_phases(get_workload("chat"), WorkloadOptions())[0]
    assert len(phase.requests) == 1000 and phase.rate is None
    inputs = [r.input_len for r in phase.requests]
    outputs = [r.output_len for r in phase.requests]
    assert 100 <= min(inputs) <= max(inputs) <= 1024
    assert 100 <= min(outputs) <= max(outputs) <= 1024
    assert all(r.arrival_s == 0 and r.ignore_eos for r in phase.requests)


def test_sequential_workloads_run_one_at_a_time():
    phase = build_phases(get_workload("interactive"), WorkloadOptions())[0]
    assert phase.max_concurrency == 1 and len(phase.requests) == 20
    assert {(r.input_len, r.output_len) for r in phase.requests} == {(4096, 250)}
    long = build_phases(get_workload("long"), WorkloadOptions())[0]
    assert [r.input_len for r in long.requests] == [32768, 65536, 131072, 32768]


def test_rates_sweep_and_override():
    phases = build_phases(get_workload("rates"), WorkloadOptions(num_requests=400))
    assert [p.rate for p in phases] == [0.5, 1, 2, 4, 8]
    for phase in phases:  # Poisson: the mean gap is 1/rate (loosely)
        gaps = np.diff([r.arrival_s for r in phase.requests])
        assert abs(gaps.mean() * phase.rate - 1) < 0.2
    custom = build_phases(get_workload("chat"), WorkloadOptions(request_rates=(2.0, 4.0)))
    assert [p.label for p in custom] == ["rate2", "rate4"]


def test_tail_lognormal_shape():
    outputs = np.asarray([o for _, o in sample_lengths(get_workload("tail"), 20000,
                                                       WorkloadOptions())])
    assert abs(np.median(outputs) - 200) < 15
    assert 0.04 < (outputs > 2000).mean() < 0.06


def test_length_scale():
    scaled = build_phases(get_workload("batch"), WorkloadOptions(num_requests=3,
                                                                 length_scale=0.01))[0]
    assert {(r.input_len, r.output_len) for r in scaled.requests} == {(41, 2)}


def test_bursty_pattern():
    pattern = BurstyPattern()
    times = pattern.arrivals(np.random.default_rng(0))
    assert 3800 < len(times) < 4800 and times.max() < 600
    windows = pattern.burst_windows()
    assert len(windows) == 4 and all(hi - lo == 30 for lo, hi in windows)
    in_burst = sum(any(lo <= t < hi for lo, hi in windows) for t in times)
    assert 3000 < in_burst < 4200  # 4 x 30 s x 30 req/s
    short = build_phases(get_workload("bursty"), WorkloadOptions(time_scale=0.1))[0]
    assert max(r.arrival_s for r in short.requests) < 60


def test_bursty_rates_scale_apart_from_its_duration():
    """A third of the rates over the same windows: about a third of the requests, the
    bursts still 30 s long and 15 times the steady rate."""
    slow = BurstyPattern().scaled(time_scale=1.0, rate_scale=1 / 3)
    assert (slow.base_rate, slow.burst_rate, slow.burst_s) == (2 / 3, 10.0, 30.0)
    times = slow.arrivals(np.random.default_rng(0))
    assert 1300 < len(times) < 1800 and times.max() < 600  # ~1,520 expected
    in_burst = sum(any(lo <= t < hi for lo, hi in slow.burst_windows()) for t in times)
    assert 1000 < in_burst < 1400  # 4 x 30 s x 10 req/s
    phase = build_phases(get_workload("bursty"),
                         WorkloadOptions(time_scale=0.1, rate_scale=0.5))[0]
    assert 180 < len(phase.requests) < 300  # about half of the 0.1-scale run's 493
    with pytest.raises(ValueError, match="rate_scale"):
        WorkloadOptions(rate_scale=0)


def test_gamma_burstiness():
    rng = np.random.default_rng(0)
    even = np.diff(gamma_arrivals(rng, 5000, 10.0, burstiness=8.0))
    bursty = np.diff(gamma_arrivals(rng, 5000, 10.0, burstiness=0.25))
    assert abs(even.mean() - 0.1) < 0.01 and abs(bursty.mean() - 0.1) < 0.02
    assert bursty.std() > 3 * even.std()
    assert (gamma_arrivals(rng, 4, float("inf")) == 0).all()


def test_prompts_have_the_requested_lengths():
    requests = build_phases(get_workload("chat"), WorkloadOptions(num_requests=5))[0].requests
    fill_token_prompts(requests, seed=0, vocab_size=500)
    assert all(len(r.prompt) == r.input_len for r in requests)
    assert all(100 <= t < 500 for r in requests for t in r.prompt)
    fill_text_prompts(requests, seed=0)
    assert all(len(r.prompt.split()) == r.input_len for r in requests)


@pytest.mark.parametrize("bad", [dict(length_scale=0), dict(num_requests=0),
                                 dict(request_rates=(0.0,)), dict(burstiness=-1)])
def test_invalid_options(bad):
    with pytest.raises(ValueError):
        WorkloadOptions(**bad)


def test_unknown_workload():
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("nope")


def test_priority_mix_and_rates():
    phases = build_phases(get_workload("priority"), WorkloadOptions())
    assert [p.rate for p in phases] == [3, 5] and all(len(p.requests) == 2000 for p in phases)
    for phase in phases:  # 20% urgent, seeded: the same requests on every system
        urgent = [r.priority == URGENT for r in phase.requests]
        assert 0.17 < np.mean(urgent) < 0.23
        assert {r.priority for r in phase.requests} == {0, URGENT}
    endpoint = Endpoint("http://x", "m")  # the request body carries it
    assert endpoint.payload(next(r for r in phases[0].requests if r.priority))["priority"] == URGENT
    assert "priority" not in endpoint.payload(next(r for r in phases[0].requests if not r.priority))
    again = build_phases(get_workload("priority"), WorkloadOptions())
    assert [r.priority for r in again[0].requests] == [r.priority for r in phases[0].requests]
    assert {r.priority for r in build_phases(get_workload("bursty"),
                                             WorkloadOptions(time_scale=0.05))[0].requests} == {0}
