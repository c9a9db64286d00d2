"""When decode steps replay CUDA graphs unless the user says (the default's rule; the graphs
themselves run on GPUs only: tests/engine/test_gpu_engine.py and the NCCL tests)."""
from types import SimpleNamespace

import pytest

from parashift.worker.model_runner import ModelRunner, graphs_by_default
from parashift.worker.shared_ffn import CAS_WEIGHTS, WAS_WEIGHTS


@pytest.mark.parametrize("possible, every_plan, seesaw, expected", [
    (True, True, False, True),     # static plans, pipelined or not, experts or not; SiDP CaS
    (True, False, False, False),   # SiDP switching WaS <-> CaS: WaS's steps run eagerly
    (True, False, True, True),     # Seesaw: the decode plan replays graphs
    (False, True, False, False),   # CPU, torch attention
    (False, False, True, False),
])
def test_graphs_by_default(possible, every_plan, seesaw, expected):
    assert graphs_by_default(possible, every_plan, seesaw) is expected


def _plan(name, pp=1, weights=None):
    return SimpleNamespace(name=name, state=SimpleNamespace(pp=SimpleNamespace(size=pp)),
                           weights=weights)


def _graph_plan_names(resources, seesaw=None, shared_ffn=None):
    runner = SimpleNamespace(resources={r.name: r for r in resources}, seesaw=seesaw,
                             shared_ffn=shared_ffn)
    return [r.name for r in ModelRunner._graph_plans(runner)]


def test_which_plans_replay_graphs():
    """Pipelined plans replay their stages' graphs, except a Seesaw prefill plan (its
    weights leave the device while the decode plan runs); sharing FFN weights, only CaS."""
    assert _graph_plan_names([_plan("tp2"), _plan("pp2", pp=2)]) == ["tp2", "pp2"]
    assert _graph_plan_names([_plan("pp2", pp=2), _plan("tp2")], seesaw=object()) == ["tp2"]
    assert _graph_plan_names([_plan("was", weights=WAS_WEIGHTS), _plan("cas", weights=CAS_WEIGHTS)],
                             shared_ffn=object()) == ["cas"]
