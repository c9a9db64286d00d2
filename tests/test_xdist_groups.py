"""The rule that keeps the tests that start processes apart under `pytest -n 2`
(tests/xdist_groups.py), and its guard, which this session runs under."""
import multiprocessing

import pytest

from tests.xdist_groups import PROCS, unit_of


def test_tests_that_start_processes_share_one_unit_and_others_go_by_file():
    assert unit_of("tests/distributed/test_plans.py::test_x[tp2]") == PROCS
    assert unit_of("tests/entrypoints/openai/test_self_healing.py::test_y") == PROCS
    assert unit_of("tests/engine/test_scheduler.py::test_z[a-b]") == "tests/engine/test_scheduler.py"


def test_a_test_outside_the_unit_cannot_start_a_process():
    process = multiprocessing.get_context("fork").Process(target=int)
    with pytest.raises(RuntimeError, match="PROCESS_PATHS in tests/xdist_groups.py"):
        process.start()
    assert process.pid is None  # refused before anything started
