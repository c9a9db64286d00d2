"""Seesaw's weight arena re-sharding from peers, on gloo ranks (one process each): with the
least arena, after 20 round trips every rank's parameters under each plan equal a fresh
load of that plan (checksum), at the same addresses; bytes came over the peer links, and
what came from the pinned host copies is exactly what the schedule reads there (what no
rank holds, and the pieces that break cycles too large for the staging), and the host
copies keep only those bytes (none where every cycle fits the staging). On the GPU
machine (PARASHIFT_TEST_DEVICE=cuda) the ranks are GPUs and the transfers go over NCCL."""
import hashlib

import pytest
import torch
import torch.distributed as dist

from parashift.loader.source import load_hf_config, resolve_model
from parashift.parallel.host_copy import merge_extents
from parashift.parallel.plan import Plan
from parashift.parallel.seesaw_weights import PeerGroup, WeightArena
from parashift.loader.weights import load_model_weights
from parashift.parallel.weight_staging import host_reads, release
from parashift.worker.peer_weights import load_group_weights
from tests.distributed.test_plans import DEVICE
from tests.engine.conftest import save_tiny_llama
from tests.helpers.ranks import free_port, run_ranks
from tests.parallel.test_seesaw_weights import addresses, build

ROUND_TRIPS = 20
LARGE, SMALL = 2**30, 32 * 2**10  # staging bytes: every switch in one round, or many rounds


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """4 layers, 2 KV heads (replicated under TP4) and a vocabulary TP4 pads (510 rows)."""
    return save_tiny_llama(tmp_path_factory.mktemp("peer_llama"), num_hidden_layers=4,
                           num_key_value_heads=2, vocab_size=510)


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        raw = param.detach().cpu().flatten().view(torch.uint8).numpy().tobytes()
        digest.update(name.encode() + raw)
    return digest.hexdigest()


def _rank(rank: int, port: int, world: int, model_dir: str, prefill: str, decode: str,
          staging: int, reload: bool) -> None:
    torch.set_num_threads(1)
    device = torch.device(DEVICE, rank) if DEVICE == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dist.all_reduce(torch.zeros(1, device=device))  # NCCL: the group's first op, every rank
        source = resolve_model(model_dir)
        tiny = (source, load_hf_config(source))
        plans = [Plan.parse(prefill), Plan.parse(decode)]
        fresh = {p: checksum(build(tiny, p, rank)) for p in (prefill, decode)}
        weights = load_group_weights(tiny[1], source, plans, torch.float32, 64)
        models = {p: build(tiny, p, rank).to(device) for p in (prefill, decode)}
        if reload:  # the running plan's loader fills the arena: nothing of it staged
            release(models[prefill])
        arena = WeightArena(models, device,
                            peers=PeerGroup(dist.group.WORLD, rank, weights, staging),
                            reload={prefill: lambda: load_model_weights(models[prefill], source)}
                            if reload else None)
        assert checksum(models[prefill]) == fresh[prefill]
        fixed = {p: addresses(m) for p, m in models.items()}
        reads = {new: merge_extents(host_reads(schedule, rank, arena.regions[new].offset),
                                    arena.regions[new].size)
                 for (_, new), schedule in arena.schedules.items()}
        regions = sum(r.size for r in arena.regions.values())
        assert arena.pinned_bytes == sum(b - a for r in reads.values() for a, b in r), (
            arena.pinned_bytes, reads)
        assert arena.pinned_bytes < regions // 2, (arena.pinned_bytes, regions)  # < one plan
        for _ in range(ROUND_TRIPS):
            for old, new in ((prefill, decode), (decode, prefill)):
                schedule = arena.schedules[(old, new)]
                into = schedule.bytes_into(rank)
                moved = arena.prefetch(new)
                switch = arena.activate(new)
                assert checksum(models[new]) == fresh[new], (old, new)
                assert addresses(models[new]) == fixed[new]
                assert moved.peer_bytes + switch.peer_bytes == into["peer"]
                assert moved.host_bytes + switch.host_bytes == into["host"] == (
                    schedule.unheld[rank] + schedule.cycle[rank])
                assert moved.bytes + switch.bytes == sum(into.values())
                assert into["peer"] > 0  # every rank of these pairs lacks what a peer holds
                if staging == LARGE:  # every cycle staged: the host copy serves none
                    assert into["host"] == 0 and schedule.unheld[rank] == 0
                    assert arena.pinned_bytes == 0
                else:
                    assert len(schedule.phase2) > 1
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world: int, *args) -> None:
    if DEVICE == "cuda" and world > torch.cuda.device_count():
        pytest.skip(f"needs {world} GPUs")
    run_ranks(_rank, world, free_port(), world, *args)


@pytest.mark.parametrize("prefill, decode, world, staging, reload", [
    ("pp2", "tp2", 2, LARGE, False), ("pp2", "tp2", 2, SMALL, False),
    ("pp2xtp2", "tp4", 4, LARGE, False), ("pp4", "pp2xtp2", 4, SMALL, False),
    ("pp2", "tp2", 2, SMALL, True)])
def test_round_trips_from_peers_leave_each_plan_equal_to_a_fresh_load(model_dir, prefill, decode,
                                                                     world, staging, reload):
    """`reload`: the running plan's loader fills its region in the arena (the engine's
    way where the loader can), its host copy then read back from the arena."""
    spawn(world, model_dir, prefill, decode, staging, reload)
