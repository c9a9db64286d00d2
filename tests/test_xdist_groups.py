"""The rule that keeps the tests that start processes apart under `pytest -n 2`
(tests/xdist_groups.py), and its guard, which this session runs under."""
import multiprocessing

import pytest

from tests.xdist_groups import PROCS, longest_first, seconds_by_unit, unit_of


def test_tests_that_start_processes_share_one_unit_and_others_go_by_file():
    assert unit_of("tests/distributed/test_plans.py::test_x[tp2]") == PROCS
    assert unit_of("tests/entrypoints/openai/test_self_healing.py::test_y") == PROCS
    assert unit_of("tests/engine/test_scheduler.py::test_z[a-b]") == "tests/engine/test_scheduler.py"


def test_a_test_outside_the_unit_cannot_start_a_process():
    process = multiprocessing.get_context("fork").Process(target=int)
    with pytest.raises(RuntimeError, match="PROCESS_PATHS in tests/xdist_groups.py"):
        process.start()
    assert process.pid is None  # refused before anything started


def test_units_go_out_longest_first_then_by_their_number_of_tests():
    units = [("a.py", [1, 2, 3]), (PROCS, [1, 2]), ("b.py", [1]), ("c.py", [1, 2]),
             ("d.py", [1, 2, 3, 4])]
    seconds = {PROCS: 900.0, "b.py": 60.0, "c.py": 2.0}
    assert [name for name, _ in longest_first(units, seconds)] == [PROCS, "b.py", "c.py", "d.py",
                                                                   "a.py"]


def test_a_runs_log_gives_each_units_seconds():
    log = """============================= slowest durations =============================
12.50s call     tests/distributed/test_plans.py::test_x[tp2]
3.00s setup    tests/kernels/test_a.py::test_interpreted[q_lens=[1, 5]-dtype=float32]
2.25s call     tests/executor/test_b.py::test_y
0.40s teardown tests/kernels/test_a.py::test_z
0.30s call     tests/engine/test_c.py::test_w
2633 passed in 1467.66s (0:24:27)"""
    assert seconds_by_unit(log) == {PROCS: 14.8, "tests/kernels/test_a.py": 3.4}
