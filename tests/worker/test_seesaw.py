"""Seesaw's rank hooks (worker/seesaw.py) at start-up: the running plan's model leaves the
device (into its host copy) before the other plan's model is built, and both are in the
arena after it, equal to fresh loads."""
from types import SimpleNamespace

import pytest
import torch

from parashift.loader.weights import load_model_weights
from parashift.parallel.plan import Plan
from parashift.parallel.state import GroupHandle, ParallelState
from parashift.worker.rank_hooks import RankSetup
from parashift.worker import seesaw
from parashift.worker.seesaw import loads_into_arena, rank_hooks_for
from tests.parallel.test_seesaw_weights import build, checksum, storages, tiny_model  # noqa: F401


def state_of(plan_name: str, rank: int) -> ParallelState:
    plan = Plan.parse(plan_name)

    def handle(kind):
        return GroupHandle(plan.group_of(kind, rank), rank)
    return ParallelState(plan, rank, handle("tp"), handle("sp"), handle("pp"), handle("dp"))


@pytest.mark.parametrize("reload", [False, True])
def test_the_other_plan_is_built_once_the_running_one_left_the_device(tiny_model, reload,
                                                                      monkeypatch):
    """With the runner's `reload_weights` where the rank loads into the arena (a GPU's) the
    running model is not staged: its parameters are released, and its loader fills the
    arena; on a CPU it is staged."""
    monkeypatch.setattr(seesaw, "loads_into_arena", lambda device: reload)
    source, hf_config = tiny_model
    running = build(tiny_model, "pp2", 0)
    fresh = {name: checksum(build(tiny_model, name, 0)) for name in ("pp2", "tp2")}
    loaded = storages(running)
    held = [p.detach() for p in running.parameters()]  # no address reused
    at_build = []

    def build_model(state):
        at_build.append(storages(running) & loaded)
        return build(tiny_model, state.plan.name(), state.rank)
    config = SimpleNamespace(parallel_policy="seesaw", moe_parallel="tp", seesaw=SimpleNamespace(
        weight_source="auto", resident_weights=False))
    reloads = []

    def reload_weights(model):
        reloads.append(model)
        load_model_weights(model, source)
    setup = RankSetup(config, hf_config, source, torch.device("cpu"), torch.float32, 64,
                      state_of("pp2", 0), (state_of("tp2", 0),), running, build_model, None,
                      reload_weights)
    hooks = rank_hooks_for(setup)
    assert at_build == [set()]
    assert reloads == ([running] if reload else [])
    assert storages(running) == {hooks.arena.arena.untyped_storage().data_ptr()}
    assert hooks.arena.regions["pp2"].offset == 0 and hooks.running_model() is running
    assert checksum(running) == fresh["pp2"]
    assert "seesaw arena filled" in setup.phases.seconds
    for name in ("tp2", "pp2"):
        hooks.arena.prefetch(name)
        hooks.arena.activate(name)
        assert checksum(hooks.model_for(name)) == fresh[name]
    del held


def test_only_a_gpu_rank_loads_into_the_arena():
    assert loads_into_arena(torch.device("cuda", 0)) and not loads_into_arena(torch.device("cpu"))
