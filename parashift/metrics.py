"""Prometheus metrics of one server, kept in a registry of its own.

Each `ServerMetrics` owns a `CollectorRegistry`, so several servers (as in the
tests) can live in one process without clashing on metric names."""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

PREFIX = "parashift"

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256,
                0.512, 1.024, 2.048, 4.096, 8.192)


# EngineStats fields of swap preemption -> (counter, its direction label or None)
SWAP_STATS = {"num_swapped_out": ("swaps", "out"), "num_swapped_in": ("swaps", "in"),
              "swap_bytes_out": ("swap_bytes", "out"), "swap_bytes_in": ("swap_bytes", "in"),
              "num_recompute_tokens": ("recompute_tokens", None)}
# EngineStats fields of speculative decoding -> their counters (vLLM's names)
SPEC_STATS = {"spec_decode_num_drafts": "Verifications of a sequence's draft tokens.",
              "spec_decode_num_draft_tokens": "Draft tokens verified.",
              "spec_decode_num_accepted_tokens": "Draft tokens accepted."}


class ServerMetrics:
    """What the engine loop and the request streams record."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name}
        self._build_gauges(labels)
        self._build_counters(labels)
        self._build_histograms(labels)
        self._last_preemptions = 0
        self._last_swaps = dict.fromkeys(SWAP_STATS, 0)
        self._last_spec = dict.fromkeys(SPEC_STATS, 0)
        self._last_requeued = 0
        self._last_restarts = 0
        self._last_rebalanced = 0
        self._current_plan: str | None = None

    def _build_gauges(self, labels: dict) -> None:
        def gauge(name, doc):
            g = Gauge(f"{PREFIX}_{name}", doc, list(labels), registry=self.registry)
            return g.labels(**labels)
        self.num_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_blocks_used = gauge("kv_blocks_used", "KV cache blocks in use.")
        self.kv_blocks_total = gauge("kv_blocks_total", "KV cache blocks in the pool.")
        self.kv_usage = gauge("kv_cache_usage_ratio", "Fraction of KV blocks in use (0..1).")
        self.engine_alive = gauge("engine_alive", "1 while the engine serves requests; 0 once "
                                  "it died or shuts down (/health answers 503 then).")
        self.plan_info = Gauge(f"{PREFIX}_plan_info", "1 for the plan of the last step.",
                               [*labels, "plan"], registry=self.registry)
        self.layout_width = Gauge(f"{PREFIX}_layout_width", "Replicas each group of the node "
                                  "layout merges (1: not merged).", [*labels, "group"],
                                  registry=self.registry)
        self.layout_info = Gauge(f"{PREFIX}_layout_info", "1 for the node layout (its groups' "
                                 "plans) and whether an administrator forced its width.",
                                 [*labels, "plans", "forced_width"], registry=self.registry)
        self.ranks_alive = gauge("ranks_alive", "Worker ranks alive (a lost rank's group is out "
                                 "of the layout).")
        self.groups_serving = gauge("groups_serving", "Groups of the node layout that serve.")
        self.worker_recovery_seconds = gauge("worker_recovery_seconds", "The last group "
                                             "brought back: seconds from its loss to serving.")
        self.swap_tokens_used = gauge("kv_swap_tokens_used", "Tokens of swapped requests' KV "
                                      "the CPU tiers hold (--preemption-mode swap).")
        self._labels = labels

    def _build_counters(self, labels: dict) -> None:
        def counter(name, doc):
            c = Counter(f"{PREFIX}_{name}", doc, list(labels), registry=self.registry)
            return c.labels(**labels)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.preemptions = counter("num_preemptions", "Preemptions by the scheduler.")
        self.swaps = Counter(f"{PREFIX}_kv_swaps", "Preempted requests whose KV went to the "
                             "CPU tier (out) and came back when resumed (in).",
                             [*labels, "direction"], registry=self.registry)
        self.swap_bytes = Counter(f"{PREFIX}_kv_swap_bytes", "KV bytes (the whole model's) "
                                  "copied to the CPU tier (out) and back (in) by swap "
                                  "preemption.", [*labels, "direction"], registry=self.registry)
        self.recompute_tokens = counter("recompute_tokens", "Computed tokens that preemptions "
                                        "by recompute dropped (computed again when resumed).")
        self.spec_decode = {name: counter(name, doc) for name, doc in SPEC_STATS.items()}
        self.requests_aborted = counter("requests_aborted",
                                        "Requests aborted (client gone, or shut down).")
        self.requests_requeued = counter("requests_requeued", "Requests of a lost group queued "
                                         "again on a surviving group (computed again there).")
        self.worker_restarts = counter("worker_restarts", "Replacement workers started for "
                                       "a lost group (--max-worker-restarts).")
        self.requests_rebalanced = counter("requests_rebalanced", "Waiting requests moved to "
                                           "a group back in service (its share of the queue).")
        self.requests_finished = Counter(f"{PREFIX}_request_success", "Finished requests.",
                                         [*labels, "finish_reason"], registry=self.registry)
        self.steps = Counter(f"{PREFIX}_steps", "Engine steps, by parallel plan.",
                             [*labels, "plan"], registry=self.registry)
        self.step_tokens = Counter(f"{PREFIX}_step_tokens", "Tokens computed, by plan.",
                                   [*labels, "plan"], registry=self.registry)
        self.transition_requests = Counter(
            f"{PREFIX}_transition_requests",
            "Requests of the groups a transition involved: moved (with their KV, or waiting), "
            "computed again in their new group (reprefilled), or kept where their KV was "
            "written until they end (kept), by kind.",
            [*labels, "kind", "fate"], registry=self.registry)
        self.seesaw_bytes = Counter(
            f"{PREFIX}_seesaw_transition_bytes",
            "Seesaw transitions: weight bytes written into the ranks' arenas (weights), of "
            "those received from peer ranks (weights_from_peers) and read from the pinned host "
            "copies (weights_from_host), KV bytes written to the CPU tier (kv_out) and read "
            "back (kv_in), by direction.",
            [*labels, "direction", "what"], registry=self.registry)
        self.seesaw_weight_seconds = Counter(
            f"{PREFIX}_seesaw_weight_seconds", "Seesaw transitions: seconds copying weights "
            "(the slowest rank), by direction.", [*labels, "direction"], registry=self.registry)
        self.seesaw_phase_seconds = Counter(
            f"{PREFIX}_seesaw_phase_seconds", "Seesaw groups' seconds in prefill steps, decode "
            "steps, transitions and idle (summed over groups).", [*labels, "phase"],
            registry=self.registry)

    def _build_histograms(self, labels: dict) -> None:
        def histogram(name, doc, buckets):
            h = Histogram(f"{PREFIX}_{name}", doc, list(labels), buckets=buckets,
                          registry=self.registry)
            return h.labels(**labels)
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.",
                              LATENCY_BUCKETS)
        self.tpot = histogram("time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              TPOT_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.",
                             LATENCY_BUCKETS)
        self.step_time = Histogram(f"{PREFIX}_step_duration_seconds",
                                   "Engine step wall time, by plan.", [*labels, "plan"],
                                   buckets=STEP_BUCKETS, registry=self.registry)
        self.transition_time = Histogram(
            f"{PREFIX}_transition_duration_seconds",
            "Layout transitions: drain, prepare, cutover and exposed stall time, by kind.",
            [*labels, "kind", "phase"], buckets=LATENCY_BUCKETS, registry=self.registry)

    def set_baseline(self, stats) -> None:
        """The engine's state when this server starts (an engine may outlive a server)."""
        self._last_preemptions = stats.num_preemptions
        self._last_swaps = {name: getattr(stats, name) for name in SWAP_STATS}
        self._last_spec = {name: getattr(stats, name) for name in SPEC_STATS}
        self.record_queue(stats)

    def record_step(self, stats, steps, transitions=()) -> None:
        """Called by the engine loop after each engine step with `LLMEngine.stats()`, the
        replica steps that finished (`LLMEngine.take_step_records()`) and the transitions
        committed (`LLMEngine.take_transition_records()`)."""
        for t in transitions:
            for phase in ("drain", "prepare", "cutover", "stall"):
                self.transition_time.labels(kind=t.kind, phase=phase, **self._labels).observe(
                    getattr(t, f"{phase}_s"))
            for fate, count in (("moved", t.moved - t.reprefilled), ("reprefilled", t.reprefilled),
                                ("kept", t.kept)):
                self.transition_requests.labels(kind=t.kind, fate=fate, **self._labels).inc(count)
            if t.direction:
                self._record_seesaw(t)
        self.record_queue(stats)
        delta = stats.num_preemptions - self._last_preemptions
        if delta > 0:
            self.preemptions.inc(delta)
        self._last_preemptions = stats.num_preemptions
        self._record_swaps(stats)
        self._record_spec_decode(stats)
        for step in steps:
            plan = step.plan or "none"
            self.steps.labels(plan=plan, **self._labels).inc()
            self.step_tokens.labels(plan=plan, **self._labels).inc(step.num_tokens)
            self.step_time.labels(plan=plan, **self._labels).observe(step.seconds)
            self._set_plan(plan)

    def _record_swaps(self, stats) -> None:
        for name, (what, direction) in SWAP_STATS.items():
            delta = getattr(stats, name) - self._last_swaps[name]
            self._last_swaps[name] = getattr(stats, name)
            if delta <= 0:
                continue
            counter = getattr(self, what)
            counter = counter.labels(direction=direction, **self._labels) if direction else counter
            counter.inc(delta)

    def _record_spec_decode(self, stats) -> None:
        for name, counter in self.spec_decode.items():
            delta = getattr(stats, name) - self._last_spec[name]
            self._last_spec[name] = getattr(stats, name)
            if delta > 0:
                counter.inc(delta)

    def _record_seesaw(self, t) -> None:
        for what, count in (("weights", t.weight_bytes),
                            ("weights_from_peers", t.weight_peer_bytes),
                            ("weights_from_host", t.weight_host_bytes),
                            ("kv_out", t.kv_bytes_out), ("kv_in", t.kv_bytes_in)):
            self.seesaw_bytes.labels(direction=t.direction, what=what, **self._labels).inc(count)
        self.seesaw_weight_seconds.labels(direction=t.direction, **self._labels).inc(t.weight_s)

    def record_phase_seconds(self, seconds: dict[str, float]) -> None:
        """Seesaw groups' seconds per phase (`LLMEngine.take_phase_seconds()`)."""
        for phase, value in seconds.items():
            if value:
                self.seesaw_phase_seconds.labels(phase=phase, **self._labels).inc(value)

    def record_layout(self, info: dict) -> None:
        """The node layout, as `LLMEngine.layout_info()` reports it."""
        self.layout_width.clear()
        for index, group in enumerate(info["groups"]):
            self.layout_width.labels(group=str(index), **self._labels).set(group["width"])
        self.layout_info.clear()
        plans = ",".join(group["plan"] for group in info["groups"])
        forced = "none" if info["forced_width"] is None else str(info["forced_width"])
        self.layout_info.labels(plans=plans, forced_width=forced, **self._labels).set(1)

    def record_faults(self, faults) -> None:
        """The engine's `FaultReport` (engine/faults.py): at start and when it changes."""
        self.ranks_alive.set(faults.ranks_alive)
        self.groups_serving.set(faults.groups_serving)
        self.requests_requeued.inc(faults.requests_requeued - self._last_requeued)
        self._last_requeued = faults.requests_requeued
        self.worker_restarts.inc(faults.worker_restarts - self._last_restarts)
        self._last_restarts = faults.worker_restarts
        self.requests_rebalanced.inc(faults.requests_rebalanced - self._last_rebalanced)
        self._last_rebalanced = faults.requests_rebalanced
        if faults.recovery_seconds is not None:
            self.worker_recovery_seconds.set(faults.recovery_seconds)

    def record_queue(self, stats) -> None:
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        used = stats.num_total_blocks - stats.num_free_blocks
        self.kv_blocks_used.set(used)
        self.kv_blocks_total.set(stats.num_total_blocks)
        self.kv_usage.set(used / stats.num_total_blocks if stats.num_total_blocks else 0.0)
        self.swap_tokens_used.set(stats.swap_tokens_used)

    def record_liveness(self, alive: bool) -> None:
        """Called when /metrics is read: a dead engine's last queue numbers are not left
        standing (its requests have all failed), and `engine_alive` says it is gone."""
        self.engine_alive.set(1 if alive else 0)
        if not alive:
            for gauge in (self.num_running, self.num_waiting, self.ranks_alive,
                          self.groups_serving):
                gauge.set(0)

    def _set_plan(self, plan: str) -> None:
        if plan == self._current_plan:
            return
        if self._current_plan is not None:
            self.plan_info.labels(plan=self._current_plan, **self._labels).set(0)
        self.plan_info.labels(plan=plan, **self._labels).set(1)
        self._current_plan = plan

    def record_finished(self, *, num_prompt_tokens: int, num_output_tokens: int,
                        finish_reason: str, ttft: float | None, e2e: float,
                        tpot: float | None) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.requests_finished.labels(finish_reason=finish_reason, **self._labels).inc()
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
        if tpot is not None:
            self.tpot.observe(tpot)

    def record_new_tokens(self, count: int) -> None:
        if count > 0:
            self.generation_tokens.inc(count)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
