"""When decode steps replay CUDA graphs unless the user says (the default's rule; the graphs
themselves run on GPUs only: tests/engine/test_gpu_engine.py and the NCCL tests)."""
import pytest

from parashift.worker.model_runner import graphs_by_default


@pytest.mark.parametrize("possible, one_stage, seesaw, expected", [
    (True, True, False, True),     # static one-stage plans, experts or not, any rank count
    (True, False, False, False),   # a static pipeline: its stages run eagerly
    (True, False, True, True),     # Seesaw: the decode plan replays graphs
    (False, True, False, False),   # CPU, torch attention, shared FFN weights
    (False, False, True, False),
])
def test_graphs_by_default(possible, one_stage, seesaw, expected):
    assert graphs_by_default(possible, one_stage, seesaw) is expected
