"""Latency distributions, throughput and goodput of a benchmark run."""
from dataclasses import dataclass

import numpy as np

from parashift.bench.client import RequestRecord


@dataclass(frozen=True)
class SLO:
    """Goodput counts requests whose TTFT and TPOT are both within these (ms)."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> "SLO | None":
        """'ttft:500,tpot:50' (either part may be left out)."""
        if not text:
            return None
        limits = {}
        for part in text.split(","):
            name, sep, value = part.partition(":")
            name = name.strip().lower()
            if not sep or name not in ("ttft", "tpot"):
                raise ValueError(f"bad --slo part {part!r}: expected ttft:MS or tpot:MS")
            limits[f"{name}_ms"] = float(value)
            if limits[f"{name}_ms"] <= 0:
                raise ValueError(f"--slo {name} must be > 0")
        return cls(**limits)

    def met_by(self, record: RequestRecord) -> bool:
        if not record.success:
            return False
        if self.ttft_ms is not None and record.ttft * 1e3 > self.ttft_ms:
            return False
        tpot = record.tpot
        return self.tpot_ms is None or tpot is None or tpot * 1e3 <= self.tpot_ms


def distribution_ms(values_s: list[float]) -> dict:
    """mean, median, p90, p99 in milliseconds (None when there are no values)."""
    if not values_s:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    ms = np.asarray(values_s) * 1e3
    return {"mean": float(ms.mean()), "median": float(np.median(ms)),
            "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99))}


def summarize(records: list[RequestRecord], duration_s: float, slo: SLO | None) -> dict:
    done = [r for r in records if r.success]
    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len
                       for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    duration_s = max(duration_s, 1e-9)
    summary = {
        "completed": len(done), "failed": len(records) - len(done),
        "duration_s": duration_s,
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "ttft_ms": distribution_ms([r.ttft for r in done]),
        "tpot_ms": distribution_ms([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itls]),
        "e2el_ms": distribution_ms([r.e2e for r in done]),
        "errors": sorted({r.error for r in records if r.error})[:5],
    }
    urgent = [r for r in done if r.priority < 0]
    if any(r.priority < 0 for r in records):  # the `priority` workload: its urgent ones apart
        summary["priority"] = {"completed": len(urgent),
                               "ttft_ms": distribution_ms([r.ttft for r in urgent]),
                               "tpot_ms": distribution_ms([r.tpot for r in urgent
                                                           if r.tpot is not None])}
    if slo is not None:
        good = sum(slo.met_by(r) for r in records)
        summary["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms}
        summary["goodput"] = good / duration_s
        summary["goodput_fraction"] = good / len(records) if records else 0.0
    return summary


def format_summary(label: str, summary: dict) -> str:
    """A fixed-width table for the terminal."""
    lines = [f"==== {label} ====",
             f"{'completed / failed':<28}{summary['completed']} / {summary['failed']}",
             f"{'duration (s)':<28}{summary['duration_s']:.2f}",
             f"{'input / output tokens':<28}{summary['input_tokens']} / "
             f"{summary['output_tokens']}",
             f"{'request throughput (req/s)':<28}{summary['request_throughput']:.3f}",
             f"{'output throughput (tok/s)':<28}{summary['output_throughput']:.1f}",
             f"{'total throughput (tok/s)':<28}{summary['total_token_throughput']:.1f}"]
    if "goodput" in summary:
        lines.append(f"{'goodput (req/s)':<28}{summary['goodput']:.3f} "
                     f"({summary['goodput_fraction']:.1%} within SLO)")
    if "peak_output_throughput" in summary:
        lines.append(f"{'peak output tok/s':<28}{summary['peak_output_throughput']:.1f}")
    if "spec_decode" in summary:  # the server's speculative decoding, from its /metrics
        spec = summary["spec_decode"]
        lines.append(f"{'spec acceptance / length':<28}{spec['acceptance_rate']:.1%} / "
                     f"{spec['mean_accepted_length']:.2f} tokens a verification")
    lines.append(f"{'(ms)':<10}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}")
    rows = [(key[:-3].upper(), summary[key]) for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")]
    urgent = summary.get("priority", {})  # the priority requests' rows, when there are some
    rows += [(f"prio {key[:-3].upper()}", urgent[key]) for key in ("ttft_ms", "tpot_ms") if urgent]
    for name, row in rows:
        cells = "".join(f"{row[s]:>10.1f}" if row[s] is not None else f"{'-':>10}"
                        for s in ("mean", "median", "p90", "p99"))
        lines.append(f"{name:<10}{cells}")
    for error in summary["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)
