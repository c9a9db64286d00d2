"""Records, per test, how many processes it started (multiprocessing and subprocess)."""
import json
import multiprocessing.process
import os
import subprocess

import pytest

CURRENT = {"id": None}
COUNTS = {}
_start = multiprocessing.process.BaseProcess.start
_popen = subprocess.Popen.__init__


def _count(kind):
    if CURRENT["id"]:
        COUNTS.setdefault(CURRENT["id"], {}).setdefault(kind, 0)
        COUNTS[CURRENT["id"]][kind] += 1


def start(self):
    _count("mp")
    return _start(self)


def popen(self, *a, **k):
    _count("popen")
    return _popen(self, *a, **k)


multiprocessing.process.BaseProcess.start = start
subprocess.Popen.__init__ = popen


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    CURRENT["id"] = item.nodeid
    COUNTS.setdefault(item.nodeid, {})
    try:
        return (yield)
    finally:
        CURRENT["id"] = None


def pytest_sessionfinish(session):
    with open(os.environ.get("PROCSPY_OUT", "/tmp/citime47/procspy.json"), "w") as f:
        json.dump(COUNTS, f, indent=0)


def pytest_runtest_logreport(report):
    """Each phase's seconds, appended as it ends (a killed run keeps what it measured)."""
    with open(os.environ.get("PROCSPY_DURATIONS", "/tmp/citime47/durations.jsonl"), "a") as f:
        f.write(json.dumps({"id": report.nodeid, "when": report.when,
                            "s": round(report.duration, 3), "outcome": report.outcome,
                            "procs": COUNTS.get(report.nodeid, {})}) + "\n")
