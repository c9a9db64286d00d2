"""A rank's start-up phases: timed blocks, nested ones counted once, one line per phase and
the rank's summary, a warning only past the slow start-up bound."""
import logging
import time

from parashift import startup_phases
from parashift.startup_phases import StartupPhases


def test_phases_add_up_and_nested_ones_are_not_counted_twice(caplog, monkeypatch):
    phases = StartupPhases(rank=0)
    with phases.phase("outer"):
        with phases.phase("inner"):
            time.sleep(0.02)
    with phases.phase("outer"):
        time.sleep(0.01)
    assert phases.seconds["outer"] >= phases.seconds["inner"] + 0.01 > 0.02
    assert phases.outer == {"outer"}
    monkeypatch.setattr(startup_phases, "SLOW_STARTUP_S", 1e9)
    with caplog.at_level(logging.INFO, logger="parashift.startup_phases"):
        phases.report()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("rank 0 start-up, outer: ")
    assert lines[1].startswith("rank 0 start-up,   of which inner: ")
    assert lines[2].startswith("rank 0 start-up ") and "outer" in lines[2]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    other = float(lines[2].rsplit("other ", 1)[1].removesuffix(" s"))
    assert other >= 0  # the inner phase is not subtracted twice


def test_a_slow_start_warns_once_a_rank(caplog, monkeypatch):
    monkeypatch.setattr(startup_phases, "SLOW_STARTUP_S", 0.0)
    with caplog.at_level(logging.INFO, logger="parashift.startup_phases"):
        for rank in (0, 1):
            phases = StartupPhases(rank)
            with phases.phase("model"):
                pass
            phases.report()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" s:")[0].rsplit(" ", 1)[0] for w in warnings] == [
        "rank 0 start-up", "rank 1 start-up"]
