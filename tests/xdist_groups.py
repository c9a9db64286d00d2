"""How `pytest -n 2` (pytest-xdist) shares the tests between its two workers.

Tests that start processes talking to each other under timeouts (worker ranks, gloo groups,
Ray, a `parashift serve` child with ranks) form one unit, PROCS:
one worker runs them one after the other while the other worker runs the in-process tests, so
at most one such test loads the 2 cores with its ranks at a time (two at once fire heartbeat
and step timeouts). The rule is by place: a test is in PROCS if its file is under one of
PROCESS_PATHS, and ProcessGuard fails a test outside them that starts a process through
multiprocessing (worker ranks, gloo groups, node agents), so the list cannot fall behind
silently. Every other test file is a unit of its own, so that its module fixtures (the
shared engines) are built once and a kernel file's interpreted checks run in one process.

Units go out longest first (UNIT_SECONDS, measured; units it does not name after those, by
their number of tests as xdist orders them): PROCS starts at once on one worker, and the
in-process units that take long do not come last, when one worker would run them while the
other has nothing left. `python -m tests.xdist_groups LOG` writes UNIT_SECONDS anew from the
log of a `pytest -n 2 --durations=0 tests` run.

xdist's own `--dist loadgroup` would do this from `xdist_group` marks, but it renames the
tests' ids in a way pytest 9 no longer reads: the scheduler below groups by the ids instead."""
import json
import multiprocessing.process
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PROCS = "procs"
UNIT_SECONDS = Path(__file__).with_name("unit_seconds.json")  # {unit: its tests' seconds}
PROCESS_PATHS = (
    "tests/distributed/",
    "tests/executor/",
    "tests/bench/soak/",
    "tests/bench/test_recovery_under_load.py",
    "tests/bench/test_shift_crossover.py",
    "tests/bench/test_shift_serving.py",
    "tests/bench/test_throughput_sidp.py",
    "tests/deterministic/test_flying_invariance.py",
    "tests/deterministic/test_fp8_invariance.py",
    "tests/deterministic/test_moe_invariance.py",
    "tests/deterministic/test_plan_invariance.py",
    "tests/entrypoints/openai/test_fault_isolation.py",
    "tests/entrypoints/openai/test_lifecycle.py",
    "tests/entrypoints/openai/test_self_healing.py",
    "tests/entrypoints/test_llm_shutdown.py",
    "tests/parallel/test_fast_all_reduce.py",
    "tests/worker/test_profiler.py",
)


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: PROCS, or its file."""
    path = nodeid.split("::")[0]
    return PROCS if path.startswith(PROCESS_PATHS) else path


class ProcessGuard:
    """Registered by tests/conftest.py: while a test outside PROCS runs, starting a
    multiprocessing process raises, naming the test and the list to add its file to."""

    def __init__(self):
        self.outside: str | None = None  # the running test's id, if it is outside PROCS
        start = multiprocessing.process.BaseProcess.start
        guard = self

        def guarded_start(process):
            if guard.outside:
                raise RuntimeError(
                    f"{guard.outside} starts a process ({process.name}): add its file to "
                    "PROCESS_PATHS in tests/xdist_groups.py, so that `pytest -n 2` never runs "
                    "it beside another test that starts processes")
            return start(process)
        multiprocessing.process.BaseProcess.start = guarded_start

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.outside = None if unit_of(item.nodeid) == PROCS else item.nodeid
        try:
            return (yield)
        finally:
            self.outside = None


class SchedulerPlugin:
    """Registered by tests/conftest.py where pytest-xdist is installed."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "load":  # plain `-n N`; an explicit --dist is kept
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ProcessAwareScheduling(LoadScopeScheduling):
            """xdist's loadscope with unit_of as the scope, the units longest first."""
            ordered = False

            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

            def _assign_work_unit(self, node) -> None:
                if not self.ordered:  # the work queue is whole at the first assignment
                    units = longest_first(self.workqueue.items())
                    self.workqueue.clear()
                    self.workqueue.update(units)
                    self.ordered = True
                super()._assign_work_unit(node)
        return ProcessAwareScheduling(config, log)


def longest_first(units, seconds: dict[str, float] | None = None) -> list:
    """(unit, tests) pairs by their measured seconds, then (those not measured) by their number
    of tests, both largest first; stable."""
    seconds = json.loads(UNIT_SECONDS.read_text()) if seconds is None else seconds
    return sorted(units, key=lambda unit: (-seconds.get(unit[0], 0.0), -len(unit[1])))


def seconds_by_unit(log: str) -> dict[str, float]:
    """Each unit's seconds (its tests' setup, call and teardown) in a `--durations=0` log,
    longest first."""
    seconds = defaultdict(float)
    for match in re.finditer(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+)", log, re.M):
        seconds[unit_of(match[2])] += float(match[1])
    return {unit: round(s, 1) for unit, s in sorted(seconds.items(), key=lambda u: -u[1])
            if s >= 0.5}


if __name__ == "__main__":  # python -m tests.xdist_groups LOG: UNIT_SECONDS from a run's log
    UNIT_SECONDS.write_text(json.dumps(seconds_by_unit(Path(sys.argv[1]).read_text()),
                                       indent=0) + "\n")
