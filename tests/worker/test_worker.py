"""The worker process's start-up options read from its environment."""
import pytest

from parashift.worker import worker


def test_stack_dumps_are_armed_only_when_asked(monkeypatch):
    armed = []
    monkeypatch.setattr(worker.faulthandler, "dump_traceback_later",
                        lambda seconds, repeat: armed.append((seconds, repeat)))
    monkeypatch.delenv("PARASHIFT_DUMP_STACKS_AFTER_S", raising=False)
    worker._dump_stacks_later()
    monkeypatch.setenv("PARASHIFT_DUMP_STACKS_AFTER_S", "0")
    worker._dump_stacks_later()
    assert armed == []
    monkeypatch.setenv("PARASHIFT_DUMP_STACKS_AFTER_S", "40")
    worker._dump_stacks_later()
    assert armed == [(40.0, True)]


def test_a_bad_stack_dump_delay_names_the_variable(monkeypatch):
    monkeypatch.setenv("PARASHIFT_DUMP_STACKS_AFTER_S", "soon")
    with pytest.raises(ValueError, match="PARASHIFT_DUMP_STACKS_AFTER_S must be seconds"):
        worker._dump_stacks_later()
