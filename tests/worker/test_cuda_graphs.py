"""When decode steps replay CUDA graphs unless the user says (the default's rule; the graphs
themselves run on GPUs only: tests/engine/test_gpu_engine.py and the NCCL tests)."""
import pytest

from parashift.worker.model_runner import graphs_by_default


@pytest.mark.parametrize("possible, every_plan, seesaw, expected", [
    (True, True, False, True),     # static plans, pipelined or not, experts or not; SiDP CaS
    (True, False, False, False),   # SiDP switching WaS <-> CaS: WaS's steps run eagerly
    (True, False, True, True),     # Seesaw: the decode plan replays graphs
    (False, True, False, False),   # CPU, torch attention
    (False, False, True, False),
])
def test_graphs_by_default(possible, every_plan, seesaw, expected):
    assert graphs_by_default(possible, every_plan, seesaw) is expected
