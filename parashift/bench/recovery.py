"""A worker killed under load, read from what the benchmark recorded
(benchmarks/recovery_under_load.py): each request's streamed tokens with their times and
the group it was on at the kill, and the engine's fault report sampled over time. From
them: when the loss was seen, when every group served again, the longest gap between
tokens of requests on the groups that survived, and output tokens/s before, during and
after the recovery."""
from dataclasses import dataclass, field


@dataclass
class Trace:
    """One request's stream."""
    request_id: str
    max_tokens: int
    ranks: tuple[int, ...] | None = None  # its group's ranks at the kill; None: not placed
    token_times: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens so far)
    status: str = "pending"  # completed | failed | short (finished early) | hung
    error: str = ""
    ranks_after: tuple[int, ...] | None = None  # its group's once every group served again

    @property
    def num_tokens(self) -> int:
        return self.token_times[-1][1] if self.token_times else 0


@dataclass(frozen=True)
class FaultSample:
    """The engine's fault report as the benchmark saw it change."""
    time: float
    ranks_alive: int
    groups_down: tuple[tuple[int, ...], ...]  # the ranks of each group out of service


def loss_seen(samples: list[FaultSample], kill_at: float) -> FaultSample | None:
    """The first report after the kill with a group out."""
    return next((s for s in samples if s.time >= kill_at and s.groups_down), None)


def serving_again(samples: list[FaultSample], seen: FaultSample | None,
                  world: int) -> FaultSample | None:
    """The first report after the loss with no group out and every rank alive."""
    if seen is None:
        return None
    return next((s for s in samples if s.time > seen.time and not s.groups_down
                 and s.ranks_alive == world), None)


def tokens_between(traces: list[Trace], start: float, end: float) -> int:
    """Output tokens streamed in (start, end]."""
    total = 0
    for trace in traces:
        before = 0
        for at, count in trace.token_times:
            if start < at <= end:
                total += count - before
            before = count
    return total


def longest_gap(traces: list[Trace], start: float, end: float) -> tuple[float, str | None]:
    """The longest wait between two streamed outputs of one request (its first output
    excluded: that wait is its prompt's) that overlaps [start, end], and whose it was."""
    best, whose = 0.0, None
    for trace in traces:
        times = [at for at, _ in trace.token_times]
        for earlier, later in zip(times, times[1:]):
            if later > start and earlier < end and later - earlier > best:
                best, whose = later - earlier, trace.request_id
    return best, whose


def window(traces: list[Trace], start: float, end: float) -> dict:
    seconds = max(end - start, 0.0)
    tokens = tokens_between(traces, start, end)
    return {"start_s": start, "end_s": end, "seconds": round(seconds, 3), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}


def outcome_counts(traces: list[Trace]) -> dict:
    by_status: dict[str, list[Trace]] = {}
    for trace in traces:
        by_status.setdefault(trace.status, []).append(trace)
    other = [t for t in traces if t.status not in ("completed", "failed")]
    return {"completed": len(by_status.get("completed", [])),
            "failed": len(by_status.get("failed", [])), "other": len(other),
            "failures": [{"request": t.request_id, "error": t.error}
                         for t in by_status.get("failed", [])],
            "others": [{"request": t.request_id, "status": t.status, "tokens": t.num_tokens,
                        "max_tokens": t.max_tokens, "error": t.error} for t in other]}


def analyse(traces: list[Trace], samples: list[FaultSample], kill_at: float, killed_rank: int,
            world: int, start: float, window_s: float | None = None) -> dict:
    """The report's figures, times in seconds (those named *_at_s from `start`)."""
    seen = loss_seen(samples, kill_at)
    back = serving_again(samples, seen, world)
    lost = set().union(*seen.groups_down) if seen else {killed_rank}
    survivors = [t for t in traces if t.ranks is not None and lost.isdisjoint(t.ranks)]
    on_lost = [t for t in traces if t.ranks is not None and not lost.isdisjoint(t.ranks)]
    times = [at for t in traces for at, _ in t.token_times]
    first, last = (min(times), max(times)) if times else (start, start)
    recovered = back.time if back else last
    width = window_s if window_s is not None else kill_at - first
    stall, stalled = longest_gap(survivors, kill_at, recovered)
    usual, _ = longest_gap(survivors, max(first, kill_at - width), kill_at)
    later, _ = longest_gap(survivors, recovered, recovered + width)  # the re-forming's, if any
    lost_gap, _ = longest_gap(on_lost, kill_at, last)

    def since(at):
        return None if at is None else round(at - start, 3)
    windows = {"before": window(traces, max(first, kill_at - width), kill_at),
               "during": window(traces, kill_at, recovered),
               "after": window(traces, recovered, min(recovered + width, last))
               if back and last > recovered else None}
    for part in filter(None, windows.values()):
        part["start_s"], part["end_s"] = since(part["start_s"]), since(part["end_s"])
    return {
        "requests": outcome_counts(traces),
        "kill_at_s": since(kill_at), "killed_rank": killed_rank,
        "lost_ranks": sorted(lost),
        "detection_s": None if seen is None else round(seen.time - kill_at, 3),
        "serving_again_s": None if back is None else round(back.time - kill_at, 3),
        "requests_on_lost_group": len(on_lost),
        "requests_on_lost_group_completed": sum(t.status == "completed" for t in on_lost),
        "requests_on_surviving_groups": len(survivors),
        "ended_before_kill": sum(t.ranks is None and bool(t.token_times)
                                 and t.token_times[-1][0] <= kill_at for t in traces),
        "survivors_longest_stall_s": round(stall, 3), "survivors_stalled_request": stalled,
        "survivors_longest_gap_before_s": round(usual, 3),
        "survivors_longest_gap_after_s": round(later, 3) if back else None,
        "lost_group_longest_gap_s": round(lost_gap, 3),
        **returned_group(traces, lost, back, kill_at),
        "throughput": windows,
    }


def returned_group(traces: list[Trace], lost: set[int], back: FaultSample | None,
                   kill_at: float) -> dict:
    """The requests the replaced group held once it served again (`ranks_after`: its share
    of the queue, and the probe), and its first streamed output after that, from the kill."""
    held = [t for t in traces if t.ranks_after is not None and not lost.isdisjoint(t.ranks_after)]
    first = min((at for t in held for at, _ in t.token_times if back and at > back.time),
                default=None)
    return {"requests_on_returned_group": len(held),
            "returned_group_first_output_s": None if first is None else round(first - kill_at, 3)}
