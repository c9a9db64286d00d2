"""An online workload's forecast from its arrival trace: the requests' own arrival times
instead of their mean rate, so that a burst's requests see the queue and the decode batch
the burst makes. The mean-rate model (cost/forecast.py: M/D/1 and Little's law) sees the
time average; a request that arrives in a burst sees more, and the share of requests that
arrive in bursts sets what a bursty workload's requests wait and batch with.

Per replica (requests dealt in turn by arrival, as the DP front end does), a prefill step
takes the prompts waiting when it starts, first come first, up to the step's token budget
(the last one a chunk): a burst's backlog grows and drains. A request then decodes its
output in the batch of its replica's requests decoding at the middle of its decode; a token
takes the step model's decode step at that batch, or a prefill step where its replica
prefills (chunked prefill: a prefill step decodes a token too), by the share of its decode
each takes; under SiDP, whose CaS rounds start together, any replica's prefill step holds
the round. Plans rank by their requests' median latency (TTFT and the output's tokens), as
`bench serve` reports it."""
import bisect
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from parashift.cost.runs import Engine, Served, kv_tokens, prefill_s, step_s
from parashift.cost.step import Seq, StepBatch, StepModel

DECODE_ROUNDS = 3  # TPOT sets the decode intervals that set the batches that set TPOT


@dataclass(frozen=True)
class TraceFigures:
    ttft_s: float        # mean over the requests
    tpot_s: float        # mean over the output tokens
    latency_s: float     # a request's TTFT and its output's tokens, the median
    rate: float          # requests a second, over the trace's span
    overloaded: bool     # prefills alone outlast the span, or a batch outgrows the KV
    prefill_share: float
    decode_batch: float  # mean over the requests


def trace_figures(model: StepModel, served: Served, reqs: list, arrivals: tuple,
                  engine: Engine) -> TraceFigures:
    """`served` on requests `reqs` ((input, output) each) arriving at `arrivals` (seconds)."""
    if len(arrivals) != len(reqs) or len(reqs) < 2:
        raise ValueError(f"an arrival trace needs one time a request, two or more: "
                         f"{len(arrivals)} times for {len(reqs)} requests")
    n, dp = len(reqs), served.plan.dp
    mean_in = sum(i for i, _ in reqs) / n
    context = int(mean_in + sum(o for _, o in reqs) / n / 2)
    solo = lru_cache(maxsize=None)(lambda tokens: prefill_s(model, served, tokens, engine))
    prefill = lru_cache(maxsize=None)(lambda chunks: step_s(
        model, served, StepBatch(tuple(Seq(q, c) for q, c in chunks))))
    decode = lru_cache(maxsize=None)(lambda batch: step_s(
        model, served, StepBatch.decode(min(batch, engine.max_num_seqs), context)))
    order = sorted(range(n), key=lambda i: arrivals[i])
    span = max(arrivals[order[-1]] - arrivals[order[0]], 1e-9)
    rho = sum(solo(i) for i, _ in reqs) / (span * dp)
    replica = {i: k % dp for k, i in enumerate(order)}
    ttft, busy = _queued_prefills(order, replica, arrivals, [i for i, _ in reqs],
                                  engine.max_num_batched_tokens, prefill, decode(1) / 2)
    if served.ffn_owners > 1:  # SiDP's CaS rounds start together: any replica's prefill holds all
        node = Busy.union(busy.values())
        busy = {r: node for r in busy}
    tpot = [decode(1)] * n
    for _ in range(DECODE_ROUNDS):
        batches = _decode_batches(reqs, arrivals, ttft, tpot, replica, dp)
        tpot = [_tpot(decode(b), busy[replica[i]], arrivals[i] + ttft[i], reqs[i][1] * tpot[i])
                for i, b in enumerate(batches)]
    mean_tpot = sum(o * t for (_, o), t in zip(reqs, tpot)) / sum(o for _, o in reqs)
    overloaded = rho >= 1 or max(batches) * context > kv_tokens(model, served)
    latency = statistics.median(t + o * p for t, (_, o), p in zip(ttft, reqs, tpot))
    return TraceFigures(sum(ttft) / n, mean_tpot, latency, (n - 1) / span, overloaded, rho,
                        sum(batches) / n)


def _queued_prefills(order: list, replica: dict, arrivals: tuple, prompts: list, budget: int,
                     prefill, half_step: float) -> tuple[list, dict]:
    """Each request's TTFT: its wait for the prompts ahead of it on its replica, the steps
    that prefill it, and half a step. A step takes the prompts waiting when it starts, first
    come first, up to the step's token budget (the last one a chunk, the rest of it in the
    next step)."""
    ttft = [0.0] * len(prompts)
    busy = {r: [] for r in set(replica.values())}
    for r in busy:
        queue = [i for i in order if replica[i] == r]
        done = {i: 0 for i in queue}
        free, k = -math.inf, 0  # queue[k:]: not yet prefilled to the end
        while k < len(queue):
            start = max(free, arrivals[queue[k]])
            chunks, room, j = [], budget, k
            while j < len(queue) and room > 0 and arrivals[queue[j]] <= start:
                i = queue[j]
                take = min(prompts[i] - done[i], room)
                chunks.append((i, take))
                room -= take
                j += 1
            free = start + prefill(tuple(sorted((take, done[i]) for i, take in chunks)))
            busy[r].append((start, free))
            for i, take in chunks:
                done[i] += take
                if done[i] == prompts[i]:
                    ttft[i] = free - arrivals[i] + half_step
                    k += 1
    return ttft, {r: Busy(spans) for r, spans in busy.items()}


class Busy:
    """A replica's prefill steps as time spans (in order, apart): the share of a window
    they fill."""

    def __init__(self, spans: list):
        self.starts = [a for a, _ in spans]
        self.spans = spans
        self.before = [0.0]
        for a, b in spans:
            self.before.append(self.before[-1] + b - a)
        self.mean_step = self.before[-1] / max(1, len(spans))

    @classmethod
    def union(cls, replicas) -> "Busy":
        """The spans in which any of `replicas` prefills."""
        merged = []
        for a, b in sorted(span for busy in replicas for span in busy.spans):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return cls(merged)

    def _until(self, t: float) -> float:
        k = bisect.bisect_right(self.starts, t)
        if k == 0:
            return 0.0
        a, b = self.spans[k - 1]
        return self.before[k - 1] + min(t, b) - a

    def share(self, start: float, end: float) -> float:
        return (self._until(end) - self._until(start)) / (end - start) if end > start else 0.0


def _tpot(step: float, busy: "Busy", first: float, seconds: float) -> float:
    """A token's time over a request's decode: in the share of it its replica prefills, the
    steps are prefill steps (each decodes a token too), in the rest decode steps."""
    share = busy.share(first, first + seconds)
    return 1 / ((1 - share) / step + share / max(busy.mean_step, step))


def _decode_batches(reqs: list, arrivals: tuple, ttft: list, tpot: list, replica: dict,
                    dp: int) -> list:
    """The requests of each one's replica decoding at the middle of its decode."""
    starts = [[] for _ in range(dp)]
    ends = [[] for _ in range(dp)]
    for i, (_, out) in enumerate(reqs):
        first = arrivals[i] + ttft[i]
        starts[replica[i]].append(first)
        ends[replica[i]].append(first + out * tpot[i])
    for r in range(dp):
        starts[r].sort()
        ends[r].sort()
    batches = []
    for i, (_, out) in enumerate(reqs):
        r, middle = replica[i], arrivals[i] + ttft[i] + out * tpot[i] / 2
        batches.append(max(1, bisect.bisect_right(starts[r], middle)
                           - bisect.bisect_right(ends[r], middle)))
    return batches
