"""What a run leaves behind: per-request JSON, a timeline CSV, a summary JSON."""
import csv
import json
import statistics
from pathlib import Path

import numpy as np

from parashift.bench.runner import PhaseResult
from parashift.bench.server_metrics import plan_per_interval

TIMELINE_FIELDS = ("t_s", "in_flight", "started", "finished", "output_tok_per_s",
                   "ttft_median_ms", "server_running", "server_waiting", "kv_usage", "plan",
                   "transitions", "transition_s")


def build_timeline(result: PhaseResult, interval_s: float = 1.0) -> list[dict]:
    """One row per `interval_s` of the run."""
    n_bins = max(1, int(np.ceil(result.duration_s / interval_s)))
    edges = [i * interval_s for i in range(n_bins + 1)]
    plans = plan_per_interval(result.server_samples, edges)
    rows = []
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        row = {"t_s": lo, **_client_view(result.records, lo, hi),
               "plan": plans[i], **_server_view(result.server_samples, hi)}
        rows.append(row)
    return rows


def _client_view(records, lo: float, hi: float) -> dict:
    width = hi - lo
    in_flight = sum(max(0.0, min(r.end_s, hi) - max(r.start_s, lo)) for r in records
                    if r.end_s is not None) / width
    tokens = 0.0
    for r in records:
        if r.success and r.chunk_times:
            per_chunk = r.output_tokens / len(r.chunk_times)
            tokens += per_chunk * sum(lo <= t < hi for t in r.chunk_times)
    ttfts = [r.ttft * 1e3 for r in records if r.ttft is not None and lo <= r.start_s < hi]
    return {"in_flight": in_flight,
            "started": sum(lo <= r.start_s < hi for r in records),
            "finished": sum(r.success and lo <= r.end_s < hi for r in records),
            "output_tok_per_s": tokens / width,
            "ttft_median_ms": statistics.median(ttfts) if ttfts else None}


def _server_view(samples, t: float) -> dict:
    """The server's gauges at `t`, and the transitions (count, seconds) committed so far."""
    latest = None
    for sample in samples:
        if sample.t > t:
            break
        latest = sample
    if latest is None:
        return {"server_running": None, "server_waiting": None, "kv_usage": None,
                "transitions": 0.0, "transition_s": 0.0}
    return {"server_running": latest.running, "server_waiting": latest.waiting,
            "kv_usage": latest.kv_usage, "transitions": latest.transitions,
            "transition_s": latest.transition_s}


def write_timeline_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TIMELINE_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row[k] is None else row[k]) for k in TIMELINE_FIELDS})


def write_requests_json(result: PhaseResult, path: Path) -> None:
    path.write_text(json.dumps([r.to_dict() for r in result.records], indent=1))


def write_summary_json(config: dict, phases: list[dict], path: Path) -> None:
    path.write_text(json.dumps({"config": config, "phases": phases}, indent=2))


def peak_output_throughput(rows: list[dict]) -> float:
    return max((row["output_tok_per_s"] for row in rows), default=0.0)
