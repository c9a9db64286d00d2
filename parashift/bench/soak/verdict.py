"""The soak's checks over its record: each request answered, KV blocks free, the server
idle and healthy, no process grown or left a zombie, every kill recovered from (where the
server heals), and a clean stop."""
from collections import Counter

from parashift.bench.soak.outcomes import FAILURES


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _requests(record: dict) -> list[dict]:
    outcomes = record["outcomes"]
    failed = [o for o in outcomes if o["status"] in FAILURES]
    counts = Counter(o["status"] for o in outcomes)
    sample = "; ".join(f"{o['kind']} {o['status']}: {o['detail']}" for o in failed[:5])
    return [_check("every request answered", outcomes and not failed,
                   f"{len(outcomes)} requests: {dict(sorted(counts.items()))}"
                   + (f"; first failures: {sample}" if failed else ""))]


def _server_state(record: dict) -> list[dict]:
    metrics = record.get("metrics_final", {})
    used, total = metrics.get("parashift_kv_blocks_used"), metrics.get("parashift_kv_blocks_total")
    running = metrics.get("parashift_num_requests_running")
    waiting = metrics.get("parashift_num_requests_waiting")
    code, body = record.get("health_final", (0, {}))
    healthy = code == 200 and (body.get("status") == "ok" or not record["heal"])
    return [_check("KV blocks all free", used == 0 and total, f"{used} of {total} used"),
            _check("no request left", running == 0 and waiting == 0,
                   f"{running} running, {waiting} waiting"),
            _check("health at the end", healthy, f"{code} {body}")]


def _processes(record: dict) -> list[dict]:
    rows = record.get("leaks", [])
    bad = [f"{row['slot']}: {', '.join(row['problems'])}" for row in rows if not row["ok"]]
    lost = [row["slot"] for row in rows if row["lost"]]
    return [_check("processes: RSS, descriptors, threads", rows and not bad,
                   "; ".join(bad) or f"{len(rows)} processes within limits"
                   + (f" ({', '.join(lost)} lost to kills, not replaced)" if lost else "")),
            _check("no zombie", not record.get("zombies_final"),
                   f"zombies: {record.get('zombies_final')}")]


def _kills(record: dict) -> list[dict]:
    made = [k for k in record["kills"] if k["pid"] is not None]
    if not record["heal"]:
        return [_check("kills", True, f"{len(made)} made, "
                       f"{len(record['kills']) - len(made)} skipped (no healing)")]
    stuck = [k for k in made if k["recovered_s"] is None]
    times = sorted(k["recovered_s"] for k in made if k["recovered_s"] is not None)
    return [_check("every kill recovered from", not stuck,
                   f"{len(made)} kills, recovered in {times} s"
                   + (f"; not recovered: {[k['not_recovered'] for k in stuck]}" if stuck else ""))]


def _stop(record: dict) -> list[dict]:
    stop = record.get("stop", {})
    return [_check("clean stop", stop.get("exit_code") == 0 and not stop.get("processes_left"),
                   f"exit code {stop.get('exit_code')}, processes left "
                   f"{stop.get('processes_left')}")]


def judge(record: dict) -> dict:
    checks = [_check("soak ran to its end", "aborted" not in record, record.get("aborted", "")),
              *_requests(record), *_server_state(record), *_processes(record),
              *_kills(record), *_stop(record)]
    return {"passed": all(c["ok"] for c in checks), "checks": checks}
