"""Seesaw's weight arena on one rank: the prefill plan's (PP) and the decode plan's (TP)
parameters at fixed addresses in one arena, re-sharded from pinned host copies. After 20
round trips each plan's parameters equal a fresh load of that plan (checksum)."""
import hashlib

import pytest
import torch

from parashift import host_memory
from parashift.context import use_state
from parashift.loader.source import load_hf_config, resolve_model
from parashift.loader.weights import load_model_weights
from parashift.models.registry import model_class_for
from parashift.parallel.plan import Plan
from parashift.parallel.seesaw_weights import PeerGroup, WeightArena
from parashift.parallel.state import GroupHandle, ParallelState
from parashift.parallel.weight_staging import release
from tests.engine.conftest import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny Llama of 4 layers (2 per stage under PP2) and 4 KV heads (TP up to 4)."""
    path = save_tiny_llama(tmp_path_factory.mktemp("seesaw_llama"), num_hidden_layers=4,
                           num_key_value_heads=4)
    source = resolve_model(path)
    return source, load_hf_config(source)


def build(tiny_model, plan_name: str, rank: int) -> torch.nn.Module:
    """`rank`'s model under the plan, loaded (no process group: nothing communicates)."""
    source, hf_config = tiny_model
    plan = Plan.parse(plan_name)

    def handle(kind):
        return GroupHandle(plan.group_of(kind, rank), rank)
    state = ParallelState(plan, rank, handle("tp"), handle("sp"), handle("pp"), handle("dp"))
    with use_state(state):
        model = model_class_for(hf_config)(hf_config, 64)
    load_model_weights(model, source)
    return model


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode() + param.detach().flatten().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def addresses(model):
    return [p.data_ptr() for p in model.parameters()]


def reloading(tiny_model, model: torch.nn.Module) -> dict:
    """`model` released (its parameters off their storage) and its loader as the arena's
    `reload`, under `name`."""
    release(model)
    return lambda: load_model_weights(model, tiny_model[0])


@pytest.mark.parametrize("prefill,decode,rank,reload", [
    ("pp2", "tp2", 0, False), ("pp2", "tp2", 1, False), ("pp2xtp2", "tp4", 3, False),
    ("pp4", "pp2xtp2", 2, False), ("pp2", "tp2", 1, True), ("pp2xtp2", "tp4", 3, True)])
def test_twenty_round_trips_leave_each_plan_equal_to_a_fresh_load(tiny_model, prefill, decode, rank,
                                                                 reload):
    """With `reload` the running plan's loader fills its region in the arena (nothing of
    it staged), and its host copy is read back from there."""
    fresh = {name: checksum(build(tiny_model, name, rank)) for name in (prefill, decode)}
    models = {name: build(tiny_model, name, rank) for name in (prefill, decode)}
    loaders = {prefill: reloading(tiny_model, models[prefill])} if reload else None
    arena = WeightArena(models, torch.device("cpu"), reload=loaders)
    fixed = {name: addresses(m) for name, m in models.items()}
    base = arena.arena.data_ptr()
    assert all(base <= a < base + arena.arena.nbytes for m in models.values()
               for a in addresses(m))
    assert arena.pinned_bytes == sum(r.size for r in arena.regions.values())
    assert checksum(models[prefill]) == fresh[prefill]
    for _ in range(20):
        for name in (decode, prefill):
            arena.prefetch(name)
            switch = arena.activate(name)
            assert switch.bytes > 0  # the least arena: the plans overlap, each switch copies
            assert checksum(models[name]) == fresh[name]
            assert addresses(models[name]) == fixed[name]
    assert not arena.resident(decode) and arena.resident(prefill)


def test_an_arena_of_both_plans_keeps_both_resident_and_copies_nothing(tiny_model):
    models = {name: build(tiny_model, name, 0) for name in ("pp2", "tp2")}
    fresh = {name: checksum(build(tiny_model, name, 0)) for name in models}
    both = sum(WeightArena(  # the least arena first, to learn the two plans' sizes
        {n: build(tiny_model, n, 0) for n in models}, torch.device("cpu")).regions[n].size
        for n in models)
    arena = WeightArena(models, torch.device("cpu"), resident=True)
    assert arena.arena.numel() == both and arena.pinned_bytes == 0  # no host copy kept
    for _ in range(3):
        for name in ("tp2", "pp2"):
            assert arena.prefetch(name).bytes == 0 and arena.activate(name).bytes == 0
            assert all(checksum(models[n]) == fresh[n] for n in models)


def test_bad_arenas_are_refused(tiny_model, monkeypatch):
    models = {name: build(tiny_model, name, 0) for name in ("pp2", "tp2")}
    with pytest.raises(ValueError, match="the weight arena takes"):
        WeightArena(models, torch.device("cpu"), arena_bytes=1)
    with pytest.raises(ValueError, match="arena_bytes or resident"):
        WeightArena(models, torch.device("cpu"), arena_bytes=1, resident=True)
    with pytest.raises(ValueError, match="give no arena_bytes with peers"):
        WeightArena(models, torch.device("cpu"), arena_bytes=1, peers=PeerGroup(None, 0, {}, 1))
    with pytest.raises(ValueError, match="holds two plans"):
        WeightArena({"pp2": models["pp2"]}, torch.device("cpu"))
    monkeypatch.setattr(host_memory, "mem_available_bytes", lambda: 1000)
    with pytest.raises(ValueError, match="host memory cannot hold pinned weights"):
        WeightArena(models, torch.device("cpu"))


def storages(model) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters() if p.numel()}


@pytest.mark.parametrize("resident", [False, True])
def test_the_arena_is_allocated_after_every_model_left_the_device(tiny_model, monkeypatch,
                                                                  resident):
    """At the arena's allocation no parameter of either model holds the bytes it was
    loaded into (each points into its host copy), so the device never holds a model and
    the arena at once; after it, every parameter lies in the arena."""
    models = {name: build(tiny_model, name, 0) for name in ("pp2", "tp2")}
    loaded = set().union(*(storages(m) for m in models.values()))
    held = [p.detach() for m in models.values() for p in m.parameters()]  # no address reused
    seen = []
    allocate = WeightArena._allocate

    def watched(self, nbytes):
        seen.append({name: storages(m) & loaded for name, m in models.items()})
        return allocate(self, nbytes)
    monkeypatch.setattr(WeightArena, "_allocate", watched)
    arena = WeightArena(models, torch.device("cpu"), resident=resident)
    assert seen == [{"pp2": set(), "tp2": set()}]
    in_arena = {arena.arena.untyped_storage().data_ptr()}
    assert all(storages(m) == in_arena for m in models.values())
    del held


def test_a_reload_that_leaves_the_arena_or_is_not_the_running_plans_is_refused(tiny_model):
    models = {name: build(tiny_model, name, 0) for name in ("pp2", "tp2")}
    with pytest.raises(ValueError, match="only the running plan's"):
        WeightArena(models, torch.device("cpu"), reload={"tp2": lambda: None})
    release(models["pp2"])
    first = next(models["pp2"].parameters())

    def moving():
        first.data = torch.zeros(first.shape, dtype=first.dtype)
    with pytest.raises(RuntimeError, match="moved a parameter out of the arena"):
        WeightArena(models, torch.device("cpu"), reload={"pp2": moving})
