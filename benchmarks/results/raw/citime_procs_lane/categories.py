"""The process lane's tests before/after by what the change did to them: moved out, merged or
shortened, unchanged (the load's control). Sums of setup+call+teardown seconds."""
import json, sys
from collections import defaultdict

MOVED = ("test_lifecycle.py::test_stream_disconnect", "test_lifecycle.py::test_non_stream_disconnect",
         "test_lifecycle.py::test_shutdown_", "test_lifecycle.py::test_dead_engine",
         "test_lifecycle.py::test_metrics_say", "test_bench_live.py::", "test_request_lifecycle.py::")
CHANGED = ("test_fault_isolation.py::", "test_multinode.py::", "test_soak.py::",
           "test_executor.py::test_a_hung_worker", "test_seesaw.py::test_aborts",
           "test_seesaw.py::test_requests_the_tier")


def kind(test_id):
    if "sidp" in test_id:
        return "unchanged"
    if any(m in test_id for m in MOVED):
        return "moved out of the lane"
    if any(c in test_id for c in CHANGED):
        return "merged or shortened"
    return "unchanged"


def sums(path):
    out, tests = defaultdict(float), defaultdict(set)
    for line in open(path):
        r = json.loads(line)
        out[kind(r["id"])] += r["s"]
        tests[kind(r["id"])].add(r["id"])
    return out, tests


for b, a in zip(sys.argv[1::2], sys.argv[2::2]):
    bs, bt = sums(b)
    as_, at = sums(a)
    print(f"{b} -> {a}")
    for k in ("moved out of the lane", "merged or shortened", "unchanged"):
        print(f"  {k:24s} {bs[k]:7.1f} s ({len(bt[k])} tests) -> {as_[k]:7.1f} s ({len(at[k])} tests)")
    lane = lambda s: s["merged or shortened"] + s["unchanged"]
    print(f"  {'lane (moved tests in before)':24s} {sum(bs.values()):7.1f} -> {lane(as_):7.1f}")
