"""Which route each CPU GEMM takes, per (weight shape, dtype) and row bucket, timed once at
start-up on the CPU the engine runs on: plain `F.linear` (MKL or oneDNN repacking the
weight on each call), oneDNN on a weight packed once, and in fp32 at one row MKL's packed
GEMM. The fastest per (shape, bucket) is kept for the whole run, so a given shape and row
count always takes one route. `PARASHIFT_CPU_GEMM=plain|onednn|mkl` forces one route (mkl:
one-row steps in fp32; every other GEMM plain) instead of timing."""
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ENV = "PARASHIFT_CPU_GEMM"
ROUTES = ("plain", "onednn", "mkl")
ROW_BUCKETS = (1, 16, 256)  # decode at batch 1, a decode batch, a prompt chunk
LARGE_WEIGHT = 1 << 22  # out x in above which the 256-row bucket is not timed: such a
# weight is the LM head, whose rows are the step's sequences, and timing it there is slow
RACE_BUDGET_S = 0.02  # a route's timed calls for one (shape, bucket) take about this long
ROTATE = 8  # weights of one shape a few-row call sweeps
MIN_REPEATS, MAX_REPEATS = 3, 25

Shape = tuple[int, int, torch.dtype]


def bucket_of(rows: int) -> int:
    return 1 if rows == 1 else 16 if rows <= 64 else 256


def shape_of(weight: torch.Tensor) -> Shape:
    return weight.shape[0], weight.shape[1], weight.dtype


def mkl_packs() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl,
                                                         "_mkl_reorder_linear_weight")


@dataclass
class GemmChoice:
    """The routes by (shape, bucket), how they were chosen and what the timing measured
    (ms a call, the best of its repeats); `nbytes`: the packed copies made for them."""
    source: str
    routes: dict[Shape, dict[int, str]] = field(default_factory=dict)
    timings: dict[Shape, dict[int, dict[str, float]]] = field(default_factory=dict)
    mkl_bytes: dict[Shape, int] = field(default_factory=dict)  # a packed copy, where used
    seconds: float = 0.0
    nbytes: int = 0

    @classmethod
    def plain(cls, why: str) -> "GemmChoice":
        return cls(f"plain: {why}")

    def routes_of(self, weight: torch.Tensor) -> dict[int, str]:
        return self.routes.get(shape_of(weight), dict.fromkeys(ROW_BUCKETS, "plain"))

    def packed_bytes(self, weight: torch.Tensor) -> int:
        forms = set(self.routes_of(weight).values())
        return ("onednn" in forms) * weight.nbytes + \
            ("mkl" in forms) * self.mkl_bytes.get(shape_of(weight), 0)

    def describe(self) -> str:
        parts = []
        for (out, inp, dtype), by_bucket in self.routes.items():
            timed = self.timings.get((out, inp, dtype), {})
            each = ", ".join(f"{b}: {route}" + (" (" + " ".join(
                f"{r} {ms:.3f}" for r, ms in timed[b].items()) + " ms)" if b in timed else "")
                for b, route in by_bucket.items())
            parts.append(f"{out}x{inp} {str(dtype).removeprefix('torch.')} [{each}]")
        return f"{'; '.join(parts)}; {self.seconds:.2f} s"

    def as_dict(self) -> dict:
        """For benchmarks' JSON: one row per (shape, bucket)."""
        return {"source": self.source, "seconds": round(self.seconds, 3),
                "packed_bytes": self.nbytes,
                "routes": [{"out": out, "in": inp, "dtype": str(dtype).removeprefix("torch."),
                            "rows": bucket, "route": route,
                            "ms": self.timings.get((out, inp, dtype), {}).get(bucket)}
                           for (out, inp, dtype), by_bucket in self.routes.items()
                           for bucket, route in by_bucket.items()]}


def choose_routes(weights: list[torch.Tensor]) -> GemmChoice:
    """The route of each distinct weight shape by row bucket, timed on the weights of that
    shape (or forced by PARASHIFT_CPU_GEMM)."""
    forced = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if forced not in ("auto", *ROUTES):
        raise ValueError(f"{ENV}={forced!r}: expected auto, plain, onednn or mkl")
    if forced == "mkl" and not mkl_packs():
        raise ValueError(f"{ENV}=mkl: this torch has no MKL packed GEMM")
    start = time.perf_counter()
    by_shape: dict[Shape, list[torch.Tensor]] = {}
    for weight in weights:
        by_shape.setdefault(shape_of(weight), []).append(weight.detach())
    choice = GemmChoice("timed" if forced == "auto" else f"{ENV}={forced}")
    with torch.no_grad():
        for shape, same_shape in by_shape.items():
            weight = same_shape[0]
            if forced == "auto":
                choice.timings[shape] = timings = _time_shape(same_shape)
                choice.routes[shape] = _fastest(timings)
            else:
                choice.routes[shape] = _forced(forced, weight.dtype)
            if "mkl" in choice.routes[shape].values():
                choice.mkl_bytes[shape] = torch.ops.mkl._mkl_reorder_linear_weight(
                    weight, 1).nbytes
    choice.seconds = time.perf_counter() - start
    return choice


def _forced(route: str, dtype: torch.dtype) -> dict[int, str]:
    if route != "mkl":
        return dict.fromkeys(ROW_BUCKETS, route)
    one_row = "mkl" if dtype == torch.float32 else "plain"
    return {bucket: one_row if bucket == 1 else "plain" for bucket in ROW_BUCKETS}


def _fastest(timings: dict[int, dict[str, float]]) -> dict[int, str]:
    """Each bucket's fastest route; an untimed bucket takes the largest timed one's."""
    routes = {bucket: min(by_route, key=by_route.get) for bucket, by_route in timings.items()}
    for bucket in ROW_BUCKETS:
        if bucket not in routes:
            routes[bucket] = routes[max(b for b in routes if b < bucket)]
    return dict(sorted(routes.items()))


def _time_shape(weights: list[torch.Tensor]) -> dict[int, dict[str, float]]:
    """ms a call of each route at each timed bucket's rows, on random inputs. At few rows a
    call sweeps up to ROTATE weights of the shape, as a step does its layers: a GEMV reads
    its weight from memory, not from a cache one weight would stay in."""
    weights = weights[:ROTATE]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in weights] \
        if weights[0].dtype == torch.float32 and mkl_packs() else None
    linear = torch.ops.mkldnn._linear_pointwise
    gen = torch.Generator().manual_seed(0)
    timings = {}
    for bucket in ROW_BUCKETS:
        if bucket > 16 and weights[0].numel() > LARGE_WEIGHT:
            continue
        x = torch.randn(bucket, weights[0].shape[1], generator=gen).to(weights[0].dtype)
        n = len(weights) if bucket <= 16 else 1
        runs = {"plain": lambda: [F.linear(x, w) for w in weights[:n]],
                "onednn": lambda: [linear(x, p, None, "none", [], "") for p in onednn[:n]]}
        if mkl is not None and bucket == 1:
            runs["mkl"] = lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, 1)
                                   for p, w in zip(mkl, weights)]
        timings[bucket] = {name: round(ms / n, 4) for name, ms in _race(runs).items()}
    return timings


def _race(runs: dict) -> dict[str, float]:
    """The best of interleaved calls of each run, ms: two warm-up calls each (the first
    makes oneDNN's primitive), the second sizing the repeats to the budget."""
    warm = dict.fromkeys(runs, 0.0)
    for _ in range(2):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            warm[name] = time.perf_counter() - start
    repeats = max(MIN_REPEATS, min(MAX_REPEATS, int(RACE_BUDGET_S / max(min(warm.values()),
                                                                         1e-6))))
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: round(seconds * 1e3, 4) for name, seconds in best.items()}
