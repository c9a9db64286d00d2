"""When requests arrive: all at once, Poisson/gamma at a rate, or the bursty pattern.

Gamma inter-arrival times with shape `burstiness` and mean 1/rate: burstiness 1
is Poisson, below 1 is burstier, above 1 is more even."""
from dataclasses import dataclass

import numpy as np


def gamma_arrivals(rng: np.random.Generator, n: int, rate: float,
                   burstiness: float = 1.0, start: float = 0.0) -> np.ndarray:
    """`n` arrival times (seconds) at mean `rate` req/s; rate=inf: all at `start`."""
    if n <= 0:
        return np.zeros(0)
    if np.isinf(rate):
        return np.full(n, start)
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0, got {rate}, {burstiness}")
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return start + np.cumsum(gaps) - gaps[0]  # the first request arrives at `start`


@dataclass(frozen=True)
class BurstyPattern:
    """A steady rate with bursts at a higher rate (the `bursty` workload of workloads.py)."""
    duration_s: float = 600.0
    base_rate: float = 2.0
    burst_rate: float = 30.0
    num_bursts: int = 4
    burst_s: float = 30.0
    burstiness: float = 0.5

    def __post_init__(self):
        if self.duration_s <= 0 or self.base_rate <= 0 or self.burst_rate <= 0:
            raise ValueError("duration and rates must be > 0")
        if self.num_bursts * self.burst_s > self.duration_s:
            raise ValueError("the bursts do not fit in the duration")

    def scaled(self, time_scale: float, rate_scale: float = 1.0) -> "BurstyPattern":
        """The same shape over `time_scale` times the duration, at `rate_scale` times the
        steady and the burst rates (a larger model serves fewer requests a second)."""
        return BurstyPattern(self.duration_s * time_scale, self.base_rate * rate_scale,
                             self.burst_rate * rate_scale, self.num_bursts,
                             self.burst_s * time_scale, self.burstiness)

    def burst_windows(self) -> list[tuple[float, float]]:
        """Bursts centred at 1/8, 3/8, 5/8, 7/8 of the run (for four bursts)."""
        step = self.duration_s / self.num_bursts
        return [(step * (i + 0.5) - self.burst_s / 2, step * (i + 0.5) + self.burst_s / 2)
                for i in range(self.num_bursts)]

    def rate_at(self, t: float) -> float:
        in_burst = any(lo <= t < hi for lo, hi in self.burst_windows())
        return self.burst_rate if in_burst else self.base_rate

    def arrivals(self, rng: np.random.Generator) -> np.ndarray:
        """Gamma arrivals whose rate follows the pattern (piecewise constant)."""
        edges = sorted({0.0, self.duration_s, *(x for w in self.burst_windows() for x in w)})
        times = []
        for lo, hi in zip(edges, edges[1:]):
            rate = self.rate_at(lo)
            t = lo + rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness))
            while t < hi:
                times.append(t)
                t += rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness))
        return np.asarray(times)
