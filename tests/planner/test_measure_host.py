"""Host work measured on the engine itself: per step and per sequence from decode steps,
and the eager launch cost from eager steps of two depths (on the CPU here, with the H200
profile's tiny device times, so the walls are the CPU's host and compute work)."""
import torch

from parashift.cost.profile import load
from parashift.cost.shape import SHAPES
from parashift.planner import measure_host

H200 = load(SHAPES.parent / "results" / "profiles" / "h200_compute.json")


def test_eager_launch_cost_is_the_extra_layers_wall_per_kernel():
    per_kernel, notes = measure_host._eager_launch_s(H200, torch.device("cpu"))
    (low, wall_low), (high, wall_high) = notes["points"]
    assert (low, high) == measure_host.EAGER_DEPTHS and wall_high > wall_low > 0
    expected = (wall_high - wall_low) / ((high - low) * H200.kernels_per_layer)
    assert abs(per_kernel - expected) <= 1e-8  # the points are rounded to the nanosecond


def test_a_lone_requests_host_work_is_its_wall_less_the_steps_device_time(monkeypatch):
    """Lone prompts timed from admission to output, less the probe's predicted prefill step,
    fitted per request and per prompt token."""
    from parashift.cost.fit import host_line
    from parashift.cost.step import StepBatch
    monkeypatch.setattr(measure_host, "LONE_REPEATS", 2)
    (per_request, per_token), notes = measure_host.lone_host(H200, torch.device("cpu"))
    assert [n for n, _ in notes["walls"]] == list(measure_host.LONE_PROMPTS["cpu"])
    for (n, wall), (m, host) in zip(notes["walls"], notes["points"]):
        device = measure_host._device_s(H200, measure_host.PROBE, StepBatch.prefill(n), False)
        assert n == m and abs(host - max(wall - device, 0.0)) <= 1e-8 and host > 0
    fitted = host_line([tuple(p) for p in notes["points"]])  # of points rounded to the ns
    assert all(abs(got - want) <= 1e-7 for got, want in zip((per_request, per_token), fitted))
