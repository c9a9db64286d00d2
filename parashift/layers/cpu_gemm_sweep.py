"""The few-row CPU GEMM routes timed as decode steps run them: a sweep calls one route on
every weight of the model in the model's order (one step's GEMMs), so each call finds its
weight where a step finds it: in memory where the model outgrows the last-level cache, not in
a cache that a few weights of one shape fit in (8 of SmolLM2's fp32 gate_up weights: 57 MB,
inside the 300 MiB L3 of the Intel host in docs/benchmark_log.md, where a step streams 540 MB).

Every candidate route's packed copy of every weight is made at once (the sweeps of the
routes are interleaved, so the host's drift falls on all alike): where those copies do not
fit in a quarter of the available memory, layers/cpu_gemm_choice.py races a few weights
instead."""
import time

import torch

from parashift.host_memory import mem_available_bytes

SWEEP_BUCKETS = (1, 16)  # decode's rows: a GEMM reading its weight once
SWEEPS = 3  # timed sweeps of each route, after one untimed (oneDNN makes its primitives)
MEMORY_SHARE = 4  # the copies may take up to 1 / MEMORY_SHARE of the available memory

Shape = tuple[int, int, torch.dtype]


def sweep_fits(weights: list[torch.Tensor], routes: int) -> bool:
    """Whether `routes` packed copies of every weight fit in the memory share."""
    available = mem_available_bytes()
    needed = routes * sum({id(w): w.nbytes for w in weights}.values())
    return available is None or needed * MEMORY_SHARE <= available


def time_sweeps(weights: list[torch.Tensor], routes_of, pack, run_route, budget_s: float
                ) -> dict[Shape, dict[int, dict[str, float]]]:
    """ms a call of each route at each of SWEEP_BUCKETS' rows, by weight shape: the best
    sweep's time on that shape's weights over their count. `routes_of(bucket, weight)`: the
    routes raced for it (none: untimed); `pack(route, weight)` and `run_route(route, x,
    packed, weight, bias)` as layers/cpu_gemm_choice.py's. Each bucket's sweeps begin within
    its share of `budget_s` (the copies made before), at least one timed."""
    shapes = [(w.shape[0], w.shape[1], w.dtype) for w in weights]
    raced = {(b, i): routes_of(b, w) for b in SWEEP_BUCKETS for i, w in enumerate(weights)}
    routes = {r for bucket_routes in raced.values() for r in bucket_routes}
    packed = {r: [pack(r, w) if r in set().union(*(raced[b, i] for b in SWEEP_BUCKETS))
                  else None for i, w in enumerate(weights)] for r in sorted(routes)}
    gen = torch.Generator().manual_seed(0)
    inputs = {(b, s): torch.randn(b, s[1], generator=gen).to(s[2])
              for b in SWEEP_BUCKETS for s in set(shapes)}
    timings: dict[Shape, dict[int, dict[str, float]]] = {s: {} for s in set(shapes)}
    for bucket in SWEEP_BUCKETS:
        deadline = time.perf_counter() + budget_s / len(SWEEP_BUCKETS)
        best: dict[tuple[Shape, str], float] = {}
        for sweep in range(SWEEPS + 1):
            if sweep > 1 and time.perf_counter() > deadline:
                break
            for route in sorted(routes):
                seconds = _sweep(weights, shapes, bucket, route, raced, packed[route], inputs,
                                 run_route)
                if sweep > 0:
                    for shape, s in seconds.items():
                        best[shape, route] = min(best.get((shape, route), s), s)
        counts = {s: shapes.count(s) for s in set(shapes)}
        for (shape, route), seconds in best.items():
            timings[shape].setdefault(bucket, {})[route] = round(
                seconds * 1e3 / counts[shape], 4)
    return {s: t for s, t in timings.items() if t}


def _sweep(weights, shapes, bucket, route, raced, packed, inputs, run_route
           ) -> dict[Shape, float]:
    """Seconds of one route's calls on every weight it is raced for, summed by shape."""
    seconds: dict[Shape, float] = {}
    with torch.no_grad():
        for i, weight in enumerate(weights):
            if route not in raced[bucket, i]:
                continue
            x = inputs[bucket, shapes[i]]
            start = time.perf_counter()
            run_route(route, x, packed[i], weight, None)
            seconds[shapes[i]] = seconds.get(shapes[i], 0.0) + time.perf_counter() - start
    return seconds
