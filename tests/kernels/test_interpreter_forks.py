"""tests/kernels/interpreter_forks.py: each interpreted check runs in a fork of its own
(module state does not reach the next check), under the interpreter's environment; its
failures and a fork's death come back, and what a check prints does not garble the reply."""
import os

import pytest

from tests.kernels.common import run_interpreted

CALLS = []


def check_fresh(marker):
    """Fails unless it is the first call in its process."""
    assert not CALLS, CALLS
    CALLS.append(marker)
    print("a check's own output")
    assert os.environ["TRITON_INTERPRET"] == "1"


def check_dies():
    os._exit(3)


def test_each_check_runs_in_a_fork_of_its_own():
    assert run_interpreted(__name__, "check_fresh", [{"marker": 1}]) == [None]
    second = run_interpreted(__name__, "check_fresh", [{"marker": 2}, {"marker": 3}])
    assert second[0] is None and "AssertionError: [2]" in second[1]
    with pytest.raises(AssertionError, match="ended with status"):
        run_interpreted(__name__, "check_dies", [{}])
    assert run_interpreted(__name__, "check_fresh", [{"marker": 4}]) == [None]
    assert not CALLS  # nothing ran in this process
