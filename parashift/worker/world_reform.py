"""A rank's part in re-forming one torch world over the node (engine/node_reform.py).

Replaced ranks meet in a world of their own (executor/replacement.py); a plan over them
and a surviving rank has no communicator there. Once they serve, the engine asks every
rank (no step in flight) to re-form: each says it is here in the engine's store and waits
until all are (or the engine says abort: a rank died first; then nothing changed), leaves
its torch world, joins a new rendezvous generation with every rank, makes every plan's
process groups as at start-up, and points the group handles of every plan it holds at
them (the model's layers hold those handles, so nothing else is rebuilt)."""
import gc
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parashift.parallel.comm_pool import CommunicatorPool
from parashift.parallel.plan import Plan
from parashift.parallel.state import GroupHandle, ParallelState
from parashift.parallel.world import set_world_ranks

ARRIVAL_POLL_S = 0.02


@dataclass
class WorldSetup:
    """What a rank needs to join a world again: the rendezvous store, its backend, every
    plan of the node (the same list on every rank: groups are made in its order), the
    spans that get a group too, and its seesaw group's handle (None: none)."""
    rank: int
    spec: object  # WorkerSpec
    store: dist.TCPStore
    backend: str
    device: torch.device
    plans: list[Plan]
    spans: list[tuple[int, ...]]
    seesaw_group: GroupHandle | None = None


def join_world(setup: WorldSetup, generation: int, members: tuple[int, ...]) -> None:
    """Joins the torch world of `members` at rendezvous `generation` of the store."""
    dist.init_process_group(setup.backend, store=dist.PrefixStore(f"generation{generation}",
                                                                  setup.store),
                            rank=members.index(setup.rank), world_size=len(members))
    set_world_ranks(members)


def make_pool(setup: WorldSetup, plans: list[Plan]) -> CommunicatorPool:
    config = setup.spec.config
    pool = CommunicatorPool(setup.rank, setup.spec.layout.world_size, plans,
                            topology=config.topology, allow_cross_host=config.allow_cross_host_tp,
                            spans=setup.spans)
    if config.fast_all_reduce:
        pool.enable_fast_all_reduce(setup.device, pair_exchange=config.deterministic)
    return pool


def reform(setup: WorldSetup, runner, generation: int, members: tuple[int, ...]) -> str:
    """This rank's re-forming (the engine sends it with no step in flight): "aborted" if
    the engine called it off before every rank was here (this world is kept), else
    "reformed" once every plan's groups are made in the new world."""
    if not _all_here(setup, generation, members):
        return "aborted"
    graphs, runner.graphs = runner.graphs, None  # captured collectives hold the old groups
    gc.collect()
    dist.destroy_process_group()
    join_world(setup, generation, members)
    pool = make_pool(setup, setup.plans)
    for state in _states_of(runner):
        _repoint(state, pool.state_for(state.plan))
    if setup.seesaw_group is not None:
        vars(setup.seesaw_group).update(vars(pool.handle(setup.seesaw_group.ranks)))
    if graphs is not None:
        runner.graphs = runner._capture_graphs()
    return "reformed"


def _all_here(setup: WorldSetup, generation: int, members: tuple[int, ...]) -> bool:
    """Says this rank is here; waits until every member is (True) or the engine aborts
    or the start-up timeout passes (False)."""
    store, prefix = setup.store, f"reform{generation}"
    store.set(f"{prefix}/here/{setup.rank}", b"1")
    here = [f"{prefix}/here/{r}" for r in members]
    deadline = time.monotonic() + setup.spec.config.worker_timeout_s
    while time.monotonic() < deadline:
        if store.check([f"{prefix}/abort"]):
            return False
        if store.check(here):
            return True
        time.sleep(ARRIVAL_POLL_S)
    return False


def _states_of(runner) -> list[ParallelState]:
    """Every plan state this rank holds (the running one and each plan's, once)."""
    states = {id(runner.state): runner.state}
    for resources in runner.resources.values():
        states.setdefault(id(resources.state), resources.state)
    return list(states.values())


def _repoint(state: ParallelState, made: ParallelState) -> None:
    """Points `state`'s group handles (objects the layers hold) at `made`'s groups."""
    for name, handle in vars(made).items():
        old = getattr(state, name)
        if isinstance(handle, GroupHandle) and isinstance(old, GroupHandle):
            vars(old).update(vars(handle))
