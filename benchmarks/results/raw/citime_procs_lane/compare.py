"""Before/after per file (sums of setup+call+teardown), the process lane's files and the
in-process ones apart; mean 1-min load over each run's window."""
import json, sys
from collections import defaultdict

PROCS_AFTER_MOVED = {"tests/entrypoints/openai/test_request_lifecycle.py", "tests/bench/test_bench_live.py"}
MOVED_LIFECYCLE = {"test_stream_disconnect_frees_blocks", "test_non_stream_disconnect_frees_blocks",
    "test_shutdown_drains_in_flight_requests", "test_shutdown_timeout_ends_every_request",
    "test_shutdown_timeout_ends_a_request_the_engine_has_not_taken",
    "test_dead_engine_fails_pending_requests_and_health", "test_metrics_say_when_the_engine_died"}


def lane(test_id: str, before: bool) -> str:
    path, name = test_id.split("::")[0], test_id.split("::")[-1]
    if before:
        if path == "tests/entrypoints/openai/test_lifecycle.py" and name in MOVED_LIFECYCLE:
            return "moved out"
        if path == "tests/bench/test_bench_live.py" and "sidp" not in name:
            return "moved out"
        return "procs"
    return "moved out" if path in PROCS_AFTER_MOVED else "procs"


def sums(path, before):
    files, lanes = defaultdict(float), defaultdict(float)
    for line in open(path):
        r = json.loads(line)
        f = r["id"].split("::")[0]
        if "sidp" in r["id"] and f.endswith("test_bench_live.py"):
            f = "tests/bench/test_throughput_sidp.py"
        files[(lane(r["id"], before), f)] += r["s"]
        lanes[lane(r["id"], before)] += r["s"]
    return files, lanes


def load(path, start, end):
    vals = [float(l.split()[1]) for l in open(path) if start <= l.split()[0] <= end]
    return sum(vals) / len(vals) if vals else float("nan")


b, a = sys.argv[1], sys.argv[2]
bf, bl = sums(b, True)
af, al = sums(a, False)
keys = sorted(set(bf) | set(af), key=lambda k: (k[0], -bf.get(k, 0)))
print("| lane | file | before s | after s |")
print("|---|---|---|---|")
for k in keys:
    print(f"| {k[0]} | `{k[1]}` | {bf.get(k, 0):.1f} | {af.get(k, 0):.1f} |")
for l in ("procs", "moved out"):
    print(f"| **{l}** | all | **{bl.get(l, 0):.1f}** | **{al.get(l, 0):.1f}** |")
if len(sys.argv) > 3:
    print("load", load("/tmp/citime47/load.log", sys.argv[3], sys.argv[4]),
          load("/tmp/citime47/load.log", sys.argv[5], sys.argv[6]))
