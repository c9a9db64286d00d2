"""The soak's record as text: requests by kind and outcome, kills, each process's figures
after the warm-up and at the end, and the checks."""
from collections import Counter, defaultdict

STATUSES = ("completed", "error", "refused", "cancelled", "hung", "lost", "unclear",
            "refused_valid", "accepted_bad", "invalid")


def _table(header: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def requests_table(outcomes: list[dict]) -> str:
    by_kind = defaultdict(Counter)
    for outcome in outcomes:
        by_kind[outcome["kind"]][outcome["status"]] += 1
    seen = [s for s in STATUSES if any(c[s] for c in by_kind.values())]
    rows = [[kind, sum(c.values()), *(c[s] for s in seen)] for kind, c in sorted(by_kind.items())]
    total = Counter(o["status"] for o in outcomes)
    rows.append(["all", len(outcomes), *(total[s] for s in seen)])
    return _table(["kind", "requests", *seen], rows)


def _mib(sample: dict | None) -> str:
    return f"{sample['rss_kib'] / 1024:.1f}" if sample else "-"


def processes_table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        before, after = row["before"], row["after"]
        change = f"{(after['rss_kib'] - before['rss_kib']) / before['rss_kib']:+.1%}" \
            if before and after else "-"
        figure = lambda key: f"{before[key] if before else '-'} -> {after[key] if after else '-'}"
        verdict = "lost" if row["lost"] else ("ok" if row["ok"] else "; ".join(row["problems"]))
        lines.append([row["slot"], "/".join(map(str, row["pids"])), _mib(before), _mib(after),
                      change, figure("fds"), figure("threads"),
                      after["state"] if after else "gone", verdict])
    return _table(["process", "pid", "RSS MiB warm", "RSS MiB end", "change", "fds",
                   "threads", "state", "verdict"], lines)


def kills_table(kills: list[dict]) -> str:
    rows = [[k["at_s"], k["pid"] or "-", k["worker"] if k["worker"] is not None else "-",
             k["groups_before"], k["groups_after"],
             k["recovered_s"] if k["recovered_s"] is not None else (k["not_recovered"] or "-"),
             k["skipped"] or ""] for k in kills]
    return _table(["at s", "pid", "worker", "groups before", "after", "recovered s", "skipped"],
                  rows) if rows else "no kill"


def render(record: dict) -> str:
    verdict = record["verdict"]
    checks = "\n".join(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}"
                       for c in verdict["checks"])
    return "\n\n".join([
        f"soak of {' '.join(record['command'][3:])}\nhealing: {record['heal']}; "
        f"{record['config']['warmup_s']:.0f} s warm-up, {record['config']['duration_s']:.0f} s "
        f"soak; seconds from the start: {record['phases']}; "
        f"{record.get('tracebacks_in_log')} tracebacks in the server log",
        "requests (warm-up and soak)\n" + requests_table(record["outcomes"]),
        "kills\n" + kills_table(record["kills"]),
        "processes (after the warm-up -> at the end, both idle)\n"
        + processes_table(record.get("leaks", [])),
        f"checks: {'PASSED' if verdict['passed'] else 'FAILED'}\n{checks}"])
