"""Which route each CPU GEMM takes, per (weight shape, dtype) and row bucket, timed once at
start-up on the CPU the engine runs on: plain `F.linear` (MKL or oneDNN repacking the
weight on each call), oneDNN on a weight packed once (`onednn`; `onednn1`, `onednn16`,
`onednn256`: packed for the bucket's rows, where oneDNN may pick another layout, e.g. AMX's)
and, in fp32 at one row, MKL's packed GEMM (`mkl`).
Decode's few rows are timed in sweeps over every weight in the model's order, as a step
meets them (layers/cpu_gemm_sweep.py), where the routes' copies fit in memory, else, as a
prompt chunk's rows are, in races on a few weights of each shape. The fastest per (shape,
bucket) is kept for the whole run, so a given shape and row count always takes one route;
a route other than `onednn` (the packed default) wins only if it beats it by
REMATCH_MARGIN, in a second race where it was raced.
`PARASHIFT_CPU_GEMM=plain|onednn|onednnN|mkl` forces one route where it applies (onednnN:
the bucket of N rows, the rest onednn; mkl: one-row fp32 steps, the rest plain) instead of
timing."""
import functools
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from parashift.layers.cpu_gemm_sweep import SWEEP_BUCKETS, sweep_fits, time_sweeps

ENV = "PARASHIFT_CPU_GEMM"
ROW_BUCKETS = (1, 16, 256)  # decode at batch 1, a decode batch, a prompt chunk
HINTED = tuple(f"onednn{bucket}" for bucket in ROW_BUCKETS)  # packed for the bucket's rows
ROUTES = ("plain", "onednn", *HINTED, "mkl")
DEFAULT_ROUTE = "onednn"
LARGE_WEIGHT = 1 << 22  # out x in above which the 256-row bucket is not timed: such a
# weight is the LM head, whose rows are the step's sequences, and timing it there is slow
RACE_BUDGET_S = 0.015  # a route's timed calls for one (shape, bucket) take about this long
TOTAL_BUDGET_S = 3.0  # all the timing; (shape, bucket)s left when it is spent take the default
REMATCH_MARGIN = 0.03  # a winner other than the default keeps its bucket only if this much
# faster in the rematch: a tie is not worth another packed copy of the weights
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


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs `dtype` weights on this CPU (bf16 needs AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: on an AVX2-only CPU a bf16 model's GEMMs stay plain)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype))
    except RuntimeError:
        return False
    return True


def candidates(bucket: int, dtype: torch.dtype) -> tuple[str, ...]:
    """The routes raced at a bucket's rows."""
    mkl = bucket == 1 and dtype == torch.float32 and mkl_packs()
    return ("plain", "onednn", f"onednn{bucket}") + (("mkl",) if mkl else ())


def timed_buckets(weight: torch.Tensor) -> tuple[int, ...]:
    return tuple(b for b in ROW_BUCKETS if b <= 16 or weight.numel() <= LARGE_WEIGHT)


def pack(route: str, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy a route reads (None: the plain weight)."""
    if route == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight)
    if route in HINTED:
        return torch.ops.mkldnn._reorder_linear_weight(weight, int(route.removeprefix("onednn")))
    if route == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, 1)
    return None


def run_route(route: str, x: torch.Tensor, packed: torch.Tensor | None, weight: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in] times the weight by `route` on its packed copy."""
    if route == "mkl":  # packed for one row; MKL runs other row counts on `weight` itself
        return torch.ops.mkl._mkl_linear(x.contiguous(), packed, weight, bias, 1)
    if packed is None:
        return F.linear(x, weight, bias)
    return onednn_linear(x, packed, bias)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """x [rows, in] times a weight oneDNN packed (the overload itself: no packet dispatch)."""
    return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")


@dataclass
class GemmChoice:
    """The routes by (shape, bucket), how they were chosen and what the timing measured
    (ms a call, the best of its repeats); `nbytes`: the packed copies made for them."""
    source: str
    routes: dict[Shape, dict[int, str]] = field(default_factory=dict)
    timings: dict[Shape, dict[int, dict[str, float]]] = field(default_factory=dict)
    rematches: dict[Shape, dict[int, dict[str, float]]] = field(default_factory=dict)
    mkl_bytes: dict[Shape, int] = field(default_factory=dict)  # a packed copy, where used
    swept: tuple[int, ...] = ()  # the buckets timed in sweeps of every weight
    seconds: float = 0.0
    nbytes: int = 0

    @classmethod
    def plain(cls, why: str) -> "GemmChoice":
        return cls(f"plain: {why}")

    def routes_of(self, weight: torch.Tensor) -> dict[int, str]:
        return self.routes.get(shape_of(weight), dict.fromkeys(ROW_BUCKETS, "plain"))

    def packed_bytes(self, weight: torch.Tensor) -> int:
        forms = set(self.routes_of(weight).values())
        return len(forms & {"onednn", *HINTED}) * weight.nbytes + \
            ("mkl" in forms) * self.mkl_bytes.get(shape_of(weight), 0)

    def all_default(self) -> "GemmChoice":
        """The same shapes on the packed default alone (one copy: where more do not fit)."""
        return GemmChoice(f"{self.source}; {DEFAULT_ROUTE} alone (memory)",
                          {s: dict.fromkeys(ROW_BUCKETS, DEFAULT_ROUTE) for s in self.routes},
                          self.timings, self.rematches, seconds=self.seconds)

    def describe(self) -> str:
        parts = []
        for shape, by_bucket in self.routes.items():
            each = ", ".join(f"{bucket}: {route}{self._measured(shape, bucket)}"
                             for bucket, route in by_bucket.items())
            parts.append(f"{shape[0]}x{shape[1]} {str(shape[2]).removeprefix('torch.')} [{each}]")
        return f"{'; '.join(parts)}; {self.seconds:.2f} s"

    def _measured(self, shape: Shape, bucket: int) -> str:
        figures = [self.timings.get(shape, {}).get(bucket),
                   self.rematches.get(shape, {}).get(bucket)]
        said = [" ".join(f"{r} {ms:.3f}" for r, ms in f.items()) for f in figures if f]
        return f" ({'; rematch '.join(said)} ms)" if said else ""

    def as_dict(self) -> dict:
        """For benchmarks' JSON: one row per (shape, bucket)."""
        return {"source": self.source, "seconds": round(self.seconds, 3),
                "packed_bytes": self.nbytes, "swept": list(self.swept),
                "routes": [{"out": out, "in": inp, "dtype": str(dtype).removeprefix("torch."),
                            "rows": bucket, "route": route,
                            "ms": self.timings.get((out, inp, dtype), {}).get(bucket),
                            "rematch_ms": self.rematches.get((out, inp, dtype), {}).get(bucket)}
                           for (out, inp, dtype), by_bucket in self.routes.items()
                           for bucket, route in by_bucket.items()]}


def choose_routes(weights: list[torch.Tensor]) -> GemmChoice:
    """The route of each distinct weight shape by row bucket, timed on the weights of that
    shape (or forced by PARASHIFT_CPU_GEMM)."""
    forced = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if forced not in ("auto", *ROUTES):
        raise ValueError(f"{ENV}={forced!r}: expected auto or one of {', '.join(ROUTES)}")
    if forced == "mkl" and not mkl_packs():
        raise ValueError(f"{ENV}=mkl: this torch has no MKL packed GEMM")
    start = time.perf_counter()
    by_shape: dict[Shape, list[torch.Tensor]] = {}
    for weight in weights:
        by_shape.setdefault(shape_of(weight), []).append(weight.detach())
    # the shapes holding the most weight bytes first: they are what a cut budget leaves out last
    by_shape = dict(sorted(by_shape.items(), key=lambda kv: -sum(w.nbytes for w in kv[1])))
    choice = GemmChoice("timed" if forced == "auto" else f"{ENV}={forced}")
    # the sweeps time for up to half the budget (their copies made first), the races the rest
    swept = _swept_timings(weights, TOTAL_BUDGET_S / 2) if forced == "auto" else None
    choice.swept = SWEEP_BUCKETS if swept is not None else ()
    deadline = time.perf_counter() + (TOTAL_BUDGET_S / 2 if swept is not None else
                                      TOTAL_BUDGET_S)
    with torch.no_grad():
        for shape, same_shape in by_shape.items():
            weight = same_shape[0]
            if not onednn_packs(weight.dtype):
                choice.routes[shape] = dict.fromkeys(ROW_BUCKETS, "plain")
            elif forced == "auto":
                timings, rematches = _time_shape(same_shape, deadline, skip=choice.swept)
                timings = {**(swept or {}).get(shape, {}), **timings}
                choice.timings[shape] = dict(sorted(timings.items()))
                choice.rematches[shape] = rematches
                choice.routes[shape] = _decide(choice.timings[shape], rematches)
            else:
                choice.routes[shape] = _forced(forced, weight.dtype)
            if "mkl" in choice.routes[shape].values():
                choice.mkl_bytes[shape] = torch.ops.mkl._mkl_reorder_linear_weight(
                    weight, 1).nbytes
    choice.seconds = time.perf_counter() - start
    untimed = sum(len(timed_buckets(by_shape[shape][0])) - len(t)
                  for shape, t in choice.timings.items())
    if untimed:
        choice.source += f" (cut at {TOTAL_BUDGET_S:.0f} s: {untimed} buckets untimed)"
    return choice


def _forced(route: str, dtype: torch.dtype) -> dict[int, str]:
    """`route` where it applies; elsewhere onednn (plain beside mkl)."""
    rest = "plain" if route == "mkl" else "onednn"
    return {bucket: route if route in candidates(bucket, dtype) else rest
            for bucket in ROW_BUCKETS}


def swept_candidates(bucket: int, dtype: torch.dtype) -> tuple[str, ...]:
    """The routes swept at a few-row bucket: the raced ones less the one packed for one row
    (it beat the default by the margin in none of session 46's Intel-host races, and each
    route swept is one more copy of the whole model made at start-up)."""
    return tuple(r for r in candidates(bucket, dtype) if r != "onednn1")


def _swept_timings(weights: list[torch.Tensor], budget_s: float) -> dict | None:
    """The few-row buckets' timings in sweeps (layers/cpu_gemm_sweep.py) of the weights
    oneDNN packs here, or None where the routes' copies would not fit."""
    timable = [w.detach() for w in weights if onednn_packs(w.dtype)]
    copies = len({r for b in SWEEP_BUCKETS for w in timable
                  for r in swept_candidates(b, w.dtype)} - {"plain"})
    if not sweep_fits(timable, copies):
        return None
    return time_sweeps(timable, lambda b, w: swept_candidates(b, w.dtype), pack, run_route,
                       budget_s)


def _decide(timings: dict[int, dict[str, float]],
            rematches: dict[int, dict[str, float]]) -> dict[int, str]:
    """Each bucket's fastest route, the default where a winner did not beat it by
    REMATCH_MARGIN (in its rematch, where it had one); an untimed bucket takes the plain or
    default route of the largest timed one below it but above one row (else the default)."""
    routes = {}
    for bucket, by_route in timings.items():
        winner = min(by_route, key=by_route.get)
        rematch = rematches.get(bucket, by_route)
        if winner != DEFAULT_ROUTE and \
                rematch[winner] >= rematch[DEFAULT_ROUTE] * (1 - REMATCH_MARGIN):
            winner = DEFAULT_ROUTE
        routes[bucket] = winner
    for bucket in ROW_BUCKETS:
        if bucket not in routes:  # (a route packed for other rows stays with them)
            below = [b for b in routes if 1 < b < bucket and routes[b] in ("plain", "onednn")]
            routes[bucket] = routes[max(below)] if below else DEFAULT_ROUTE
    return dict(sorted(routes.items()))


def _time_shape(weights: list[torch.Tensor], deadline: float, skip: tuple[int, ...] = ()
                ) -> tuple[dict, dict]:
    """ms a call of each candidate route at each timed bucket's rows, on random inputs, and
    of the rematches (a winner other than the default against it), by bucket. At few rows
    a call sweeps up to ROTATE weights of the shape, as a step does its layers: a GEMV
    reads its weight from memory, not from a cache one weight would stay in. Buckets not
    begun by `deadline` (perf_counter) stay untimed, and so do those in `skip`."""
    weights, dtype = weights[:ROTATE], weights[0].dtype
    buckets = [b for b in timed_buckets(weights[0]) if b not in skip]
    routes = {r for bucket in buckets for r in candidates(bucket, dtype)}
    packed = {r: [pack(r, w) for w in weights] for r in routes}
    gen = torch.Generator().manual_seed(0)
    timings, rematches = {}, {}
    for bucket in buckets:
        if time.perf_counter() > deadline:
            continue
        x = torch.randn(bucket, weights[0].shape[1], generator=gen).to(dtype)
        n = len(weights) if bucket <= 16 else 1

        def sweep(route):
            return lambda: [run_route(route, x, p, w, None)
                            for p, w in zip(packed[route][:n], weights[:n])]
        timed = _race({r: sweep(r) for r in candidates(bucket, dtype)})
        timings[bucket] = {r: round(ms / n, 4) for r, ms in timed.items()}
        winner = min(timed, key=timed.get)
        if winner != DEFAULT_ROUTE:
            again = _race({r: sweep(r) for r in (winner, DEFAULT_ROUTE)})
            rematches[bucket] = {r: round(ms / n, 4) for r, ms in again.items()}
    return timings, rematches


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
