"""Samples a server's Prometheus /metrics during a run (when it has one).

From parashift it reads the steps taken under each parallel plan, the running
and waiting requests and the KV use; any other server is simply not sampled."""
import asyncio
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

STEPS = "parashift_steps_total"
TRANSITIONS = "parashift_transition_duration_seconds"
# speculative decoding's counters (parashift/metrics.py SPEC_STATS) -> ServerSample fields
SPEC_COUNTERS = {"parashift_spec_decode_num_drafts_total": "spec_drafts",
                 "parashift_spec_decode_num_draft_tokens_total": "spec_draft_tokens",
                 "parashift_spec_decode_num_accepted_tokens_total": "spec_accepted_tokens"}
GAUGES = {"parashift_num_requests_running": "running",
          "parashift_num_requests_waiting": "waiting",
          "parashift_kv_cache_usage_ratio": "kv_usage"}


@dataclass
class ServerSample:
    t: float  # seconds since the start of the run
    steps_by_plan: dict[str, float] = field(default_factory=dict)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    transitions: float = 0.0    # layout transitions committed so far
    transition_s: float = 0.0   # their drain + prepare + cutover seconds so far
    spec_drafts: float = 0.0    # speculative decoding: verifications, draft tokens, accepted
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0


def parse_sample(text: str, t: float) -> ServerSample:
    sample = ServerSample(t)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == STEPS:
                plan = s.labels.get("plan", "?")
                sample.steps_by_plan[plan] = sample.steps_by_plan.get(plan, 0.0) + s.value
            elif s.name in GAUGES:
                setattr(sample, GAUGES[s.name], s.value)
            elif s.name in SPEC_COUNTERS:
                setattr(sample, SPEC_COUNTERS[s.name], s.value)
            elif s.name == TRANSITIONS + "_count" and s.labels.get("phase") == "cutover":
                sample.transitions += s.value
            elif s.name == TRANSITIONS + "_sum":
                sample.transition_s += s.value
    return sample


class MetricsPoller:
    def __init__(self, client: httpx.AsyncClient, base_url: str, t0: float,
                 interval_s: float = 0.5):
        self.client = client
        self.url = base_url.rstrip("/") + "/metrics"
        self.t0 = t0
        self.interval_s = interval_s
        self.samples: list[ServerSample] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            if not await self._poll_once():
                return  # no parashift metrics here: stop asking
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
        await self._poll_once()

    async def _poll_once(self) -> bool:
        try:
            response = await self.client.get(self.url, timeout=5.0)
        except httpx.HTTPError:
            return bool(self.samples)
        if response.status_code != 200:
            return False
        sample = parse_sample(response.text, time.perf_counter() - self.t0)
        if not sample.steps_by_plan and sample.running is None:
            return False
        self.samples.append(sample)
        return True

    def stop(self) -> None:
        self._stop.set()


def plan_per_interval(samples: list[ServerSample], edges: list[float]) -> list[str]:
    """For each [edges[i], edges[i+1]) the plan that took the most steps ('' if none)."""
    plans = []
    for lo, hi in zip(edges, edges[1:]):
        before = _last_at_or_before(samples, lo)
        after = _last_at_or_before(samples, hi)
        if before is None or after is None:
            plans.append("")
            continue
        deltas = {p: n - before.steps_by_plan.get(p, 0.0) for p, n in after.steps_by_plan.items()}
        best = max(deltas, key=deltas.get, default="")
        plans.append(best if best and deltas[best] > 0 else "")
    return plans


def _last_at_or_before(samples: list[ServerSample], t: float) -> ServerSample | None:
    found = None
    for sample in samples:
        if sample.t > t:
            break
        found = sample
    return found


def spec_decode_summary(samples: list[ServerSample]) -> dict | None:
    """Speculative decoding over a run (its first to last sample): acceptance rate and mean
    accepted length; None where the server drafted nothing."""
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    drafts = last.spec_drafts - first.spec_drafts
    drafted = last.spec_draft_tokens - first.spec_draft_tokens
    accepted = last.spec_accepted_tokens - first.spec_accepted_tokens
    if not drafts:
        return None
    return {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4),
            "mean_accepted_length": round(1 + accepted / drafts, 3)}
