"""The named benchmark workloads, generated from a seed.

The same seed gives the same requests (lengths and arrival times) on every
system. `length_scale`, `num_requests` and `time_scale` shrink a workload for
a CPU or a smoke test; the report states them."""
import math
from dataclasses import dataclass, field

import numpy as np

from parashift.bench.arrivals import BurstyPattern, gamma_arrivals


@dataclass(frozen=True)
class Dist:
    """A length distribution: fixed, uniform [lo, hi], lognormal or a cycle of values."""
    kind: str
    a: float = 0
    b: float = 0
    values: tuple[int, ...] = ()

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.a))
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=n)
        if self.kind == "lognormal":  # a = median, b = the value 5% of samples exceed
            sigma = math.log(self.b / self.a) / 1.6448536269514722
            return np.maximum(1, np.rint(rng.lognormal(math.log(self.a), sigma, size=n)))
        if self.kind == "cycle":
            return np.asarray([self.values[i % len(self.values)] for i in range(n)])
        raise ValueError(f"unknown distribution {self.kind!r}")


def fixed(n: int) -> Dist:
    return Dist("fixed", n)


def uniform(lo: int, hi: int) -> Dist:
    return Dist("uniform", lo, hi)


@dataclass(frozen=True)
class LengthClass:
    weight: float
    input_len: Dist
    output_len: Dist


@dataclass(frozen=True)
class Workload:
    name: str
    num_requests: int
    classes: tuple[LengthClass, ...]
    arrivals: str  # "t0" | "sequential" | "rates" | "bursty"
    description: str
    rates: tuple[float, ...] = ()
    bursty: BurstyPattern | None = None
    ignore_eos: bool = True
    priority_share: float = 0.0  # of the requests, carrying priority URGENT (seeded choice)
    # "random": prompts of random tokens or words (bench/prompts.py); "repeat": a given code
    # to repeat (its output copies its input, and asks for input_len + 20% + 32 tokens)
    prompts: str = "random"

    def __post_init__(self):
        if self.arrivals not in ("t0", "sequential", "rates", "bursty"):
            raise ValueError(f"unknown arrival mode {self.arrivals!r}")

    @property
    def offline(self) -> bool:
        return self.arrivals == "t0"


URGENT = -1  # a priority request's `priority` (vLLM's order: lower runs first, default 0)


def _one(input_len: Dist, output_len: Dist) -> tuple[LengthClass, ...]:
    return (LengthClass(1.0, input_len, output_len),)


BURSTY_MIX = (LengthClass(0.7, uniform(1000, 4000), uniform(100, 500)),
              LengthClass(0.3, uniform(200, 800), uniform(50, 250)))

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("interactive", 20, _one(fixed(4096), fixed(250)), "sequential",
             "TTFT and TPOT at low traffic: one request at a time"),
    Workload("batch", 1000, _one(fixed(4096), fixed(250)), "t0",
             "peak combined throughput: all requests at t=0"),
    Workload("chat", 1000, _one(uniform(100, 1024), uniform(100, 1024)), "t0",
             "offline throughput, balanced prefill and decode"),
    Workload("summarize", 500, _one(uniform(2000, 4000), uniform(100, 300)), "t0",
             "prefill-heavy offline throughput"),
    Workload("bursty", 0, BURSTY_MIX, "bursty",
             "2 req/s with four 30 s bursts at 30 req/s (gamma, burstiness 0.5)",
             bursty=BurstyPattern()),
    Workload("rates", 200, _one(fixed(8192), fixed(250)), "rates",
             "completion time against Poisson arrival rate", rates=(0.5, 1, 2, 4, 8)),
    Workload("long", 4, _one(Dist("cycle", values=(32768, 65536, 131072)), fixed(100)),
             "sequential", "long context one at a time (32k, 64k, 128k, then 32k again)"),
    Workload("priority", 2000, BURSTY_MIX, "rates",
             "bursty's mix, 20% of it priority requests, Poisson at 3 and 5 req/s",
             rates=(3, 5), priority_share=0.2),
    Workload("tail", 2000, _one(fixed(1024), Dist("lognormal", 200, 2000)), "t0",
             "long-tail decode: output lognormal, median 200, 5% over 2000"),
    Workload("repeat", 200, _one(uniform(300, 1500), uniform(300, 1500)), "t0",
             "outputs that copy their input (a given code to repeat): speculative decoding",
             ignore_eos=False, prompts="repeat"),
)}


@dataclass
class BenchRequest:
    index: int
    input_len: int
    output_len: int
    arrival_s: float
    ignore_eos: bool = True
    prompt: str | list[int] | None = field(default=None, repr=False)
    priority: int = 0


@dataclass
class Phase:
    """One run of the client: all requests at one arrival rate (or pattern)."""
    label: str
    rate: float | None  # None: as the workload says (t0, sequential, bursty)
    requests: list[BenchRequest]
    max_concurrency: int | None = None


@dataclass(frozen=True)
class WorkloadOptions:
    seed: int = 0
    num_requests: int | None = None
    length_scale: float = 1.0
    time_scale: float = 1.0
    rate_scale: float = 1.0  # the bursty pattern's rates
    request_rates: tuple[float, ...] = ()  # overrides the workload's arrivals
    burstiness: float = 1.0

    def __post_init__(self):
        if min(self.length_scale, self.time_scale, self.rate_scale, self.burstiness) <= 0:
            raise ValueError("length_scale, time_scale, rate_scale and burstiness must be > 0")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if any(r <= 0 for r in self.request_rates):
            raise ValueError("request rates must be > 0 (inf: all at once)")


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def sample_lengths(workload: Workload, n: int, options: WorkloadOptions) -> list[tuple[int, int]]:
    """(input_len, output_len) of each request, scaled, at least 1 token each."""
    rng = np.random.default_rng([options.seed, 0])
    weights = np.asarray([c.weight for c in workload.classes])
    which = rng.choice(len(workload.classes), size=n, p=weights / weights.sum())
    lengths = np.zeros((n, 2), dtype=np.int64)
    for k, cls in enumerate(workload.classes):
        rows = np.flatnonzero(which == k)
        lengths[rows, 0] = cls.input_len.sample(rng, len(rows))
        lengths[rows, 1] = cls.output_len.sample(rng, len(rows))
    scaled = np.maximum(1, np.rint(lengths * options.length_scale)).astype(int)
    return [(int(i), int(o)) for i, o in scaled]


def build_phases(workload: Workload, options: WorkloadOptions) -> list[Phase]:
    """The runs a workload makes: one, or one per rate of a sweep."""
    arrival_rng = np.random.default_rng([options.seed, 1])
    if workload.arrivals == "bursty" and not options.request_rates:
        pattern = workload.bursty.scaled(options.time_scale, options.rate_scale)
        times = pattern.arrivals(arrival_rng)[:options.num_requests]
        return [Phase("bursty", None, _requests(workload, times, options))]
    n = options.num_requests or workload.num_requests
    rates = options.request_rates or (workload.rates if workload.arrivals == "rates" else ())
    if not rates:
        concurrency = 1 if workload.arrivals == "sequential" else None
        return [Phase(workload.arrivals, None, _requests(workload, np.zeros(n), options),
                      concurrency)]
    phases = []
    for rate in rates:
        times = gamma_arrivals(np.random.default_rng([options.seed, 1, len(phases)]), n,
                               rate, options.burstiness)
        phases.append(Phase(f"rate{rate:g}", rate, _requests(workload, times, options)))
    return phases


def _requests(workload: Workload, times: np.ndarray, options: WorkloadOptions):
    lengths = sample_lengths(workload, len(times), options)
    if workload.prompts == "repeat":  # out ~ in: the model stops where its copy ends
        lengths = [(inp, inp + inp // 5 + 32) for inp, _ in lengths]
    urgent = np.random.default_rng([options.seed, 2]).random(len(times)) < workload.priority_share
    return [BenchRequest(i, inp, out, float(t), workload.ignore_eos,
                         priority=URGENT if urgent[i] else 0)
            for i, ((inp, out), t) in enumerate(zip(lengths, times))]


def describe(workload: Workload, options: WorkloadOptions) -> dict:
    return {"workload": workload.name, "description": workload.description,
            **{k: v for k, v in vars(options).items()}}
