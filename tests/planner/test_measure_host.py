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
