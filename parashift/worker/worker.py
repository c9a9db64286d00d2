"""One worker process per rank: joins the process groups, builds its shard of
the model and KV pool under its plan, then runs steps sent by the executor."""
import dataclasses
import faulthandler
import gc
import os
import pickle
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from parashift.gc_tuning import tune_garbage_collector
from parashift.worker.model_runner import ModelRunner
from parashift.worker.peer_weights import asks_peer_path
from parashift.worker.world_reform import WorldSetup, join_world, make_pool, reform
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan
from parashift.parallel.state import ParallelState
from parashift.parallel.world import world_ranks
from parashift.step.codec import decode_step


@dataclass
class WorkerSpec:
    """What every worker is started with (pickled once, at start-up)."""
    config: object           # EngineConfig
    hf_config: object
    source: object           # ModelSource
    layout: Layout           # the starting layout: each rank's group plan fixes its weights and KV
    device_type: str         # "cpu" | "cuda"
    dtype: torch.dtype
    max_model_len: int
    master_port: int
    other_plans: tuple[Plan, ...] = ()  # plans a step may switch to (besides the layout's)
    master_addr: str = "127.0.0.1"  # the rendezvous store's host (the engine's: node 0's)
    # a replacement's: the rendezvous generation and the ranks of its world (None: every
    # rank, generation 0). Replaced ranks meet in a world of their own (executor/replacement.py)
    generation: int = 0
    members: tuple[int, ...] | None = None


HEARTBEAT_INTERVAL_S = 0.2


def worker_main(rank: int, spec: WorkerSpec, conn, heartbeats) -> None:
    """`heartbeats` is shared memory, one `time.monotonic()` slot per rank (the clock is
    system-wide): this rank stamps its slot until the process ends or stops."""
    threading.Thread(target=_beat, args=(heartbeats, rank), name="parashift-heartbeat",
                     daemon=True).start()
    try:
        _dump_stacks_later()
        runner, setup = _start(rank, spec)
        tune_garbage_collector()
        conn.send(("ready", runner.num_blocks, runner.load_seconds))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    _serve(runner, conn, setup)


def _dump_stacks_later() -> None:
    """PARASHIFT_DUMP_STACKS_AFTER_S=N: every thread's Python stack goes to stderr N seconds
    after the rank starts (and every N seconds after): where a hung rank waits."""
    value = os.environ.get("PARASHIFT_DUMP_STACKS_AFTER_S", "")
    try:
        seconds = float(value or 0)
    except ValueError:
        raise ValueError(f"PARASHIFT_DUMP_STACKS_AFTER_S must be seconds, got {value!r}") from None
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, repeat=True)


def _beat(heartbeats, rank: int) -> None:
    """A thread of its own, so a long step does not stop it (torch ops release the GIL)
    while a stopped or frozen process does: the executor reads the age of the stamp."""
    while True:
        heartbeats[rank] = time.monotonic()
        time.sleep(HEARTBEAT_INTERVAL_S)


def _start(rank: int, spec: WorkerSpec) -> tuple[ModelRunner, WorldSetup]:
    world = spec.layout.world_size
    if spec.device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device, backend = torch.device("cuda", torch.cuda.current_device()), "cuda:nccl,cpu:gloo"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device, backend = torch.device("cpu"), "gloo"
    setup = WorldSetup(rank, spec, _store(spec), backend, device, [], [])
    members = spec.members or tuple(range(world))
    join_world(setup, spec.generation, members)
    # Each group agrees on its own KV block count (its ranks may hold other shards than
    # another group's); every rank makes every group's control group, in layout order.
    groups = [plan for plan in spec.layout.plans if set(members).issuperset(plan.ranks)]
    controls = {plan.ranks: dist.new_group(world_ranks(plan.ranks), backend="gloo")
                for plan in groups}
    control = controls[spec.layout.plans[spec.layout.group_of_rank(rank)].ranks]
    # Every plan of every rank's weights (a merged group's ranks load their replica's).
    loaded = [plan.loaded_plan(r) for plan in spec.layout.plans for r in plan.ranks]
    setup.plans = list(dict.fromkeys([*spec.layout.plans, *loaded, *spec.other_plans]))
    # a seesaw group's ranks exchange weight shards at a switch: a group over all of them
    seesaw_peers = (spec.config.parallel_policy == "seesaw"
                    and asks_peer_path(spec.config, device, spec.source))
    setup.spans = [plan.ranks for plan in spec.layout.plans] if seesaw_peers else []
    # a replaced rank's world makes the plans over its own ranks; the others are built
    # unconnected, and get their groups when the node re-forms one world (world_reform.py)
    in_world = [plan for plan in setup.plans if set(members).issuperset(plan.ranks)]
    pool = make_pool(dataclasses.replace(setup, spans=[s for s in setup.spans
                                                       if set(members).issuperset(s)]),
                     in_world)
    base = spec.layout.plans[spec.layout.group_of_rank(rank)]
    state = pool.state_for(base.loaded_plan(rank))
    others = tuple(pool.state_for(plan) if plan in in_world
                   else ParallelState.unconnected(plan, rank) for plan in setup.plans
                   if rank in plan.ranks and plan != state.plan)
    setup.seesaw_group = pool.handle(base.ranks) if seesaw_peers else None

    def agree(num_blocks: int) -> int:
        t = torch.tensor([num_blocks])
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=control)
        return int(t.item())

    runner = ModelRunner(spec.config, spec.hf_config, spec.source, device, spec.dtype,
                         spec.max_model_len, state, agree, others, setup.seesaw_group)
    if base != state.plan:  # it starts in a merged plan
        runner.transition("commit", base.name())
    return runner, setup


def _store(spec: WorkerSpec) -> dist.TCPStore:
    """The engine's rendezvous store (the engine hosts it: no rank's death takes it away)."""
    return dist.TCPStore(spec.master_addr, spec.master_port, is_master=False,
                         timeout=timedelta(seconds=spec.config.worker_timeout_s))


POLL_S = 1e-4  # while a step runs, how often to check for it to end
CONTROL_PREFIX = b"PSCT"  # a control message (pickled, rare: a transition, an rpc), not a step


def _finish(runner: ModelRunner, conn, step) -> None:
    result = step.result()
    if result is not None:  # this rank is the output rank of the step's plan
        conn.send_bytes(pickle.dumps(("result", result)))


def _control(runner: ModelRunner, setup: WorldSetup, message: tuple) -> tuple[str, object]:
    """A control message: ("transition", verb, plan name, epoch), answered with its seconds,
    ("seesaw", verb, plan name, moves, tier), answered with its stats, ("reform",
    generation, members), answered with how it ended (world_reform.py), or ("rpc", method,
    args), answered with `runner.<method>(*args)`."""
    kind, *args = message
    if kind == "reform":
        return kind, reform(setup, runner, *args)
    if kind == "transition":
        return kind, runner.transition(*args)
    if kind == "seesaw":
        return kind, runner.seesaw_move(*args)
    if kind == "rpc":
        method, method_args = args
        return kind, getattr(runner, method)(*method_args)
    raise ValueError(f"unknown control message {kind!r}")


def _serve(runner: ModelRunner, conn, setup: WorldSetup) -> None:
    """Runs steps in arrival order. A step is launched as soon as it arrives, so with
    async scheduling the next step's host work overlaps the device running this one;
    the oldest step is finished (its result sent) once the device is done with it or
    the next one has been launched."""
    pending: deque = deque()
    while True:
        try:
            if pending and (len(pending) > 1 or pending[0].done()):
                _finish(runner, conn, pending.popleft())
                continue
            if pending and not conn.poll(POLL_S):
                continue  # the device is still busy: keep waiting for the next step
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the engine is gone
            break
        except BaseException:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
            break
        if message == b"shutdown":
            break
        try:
            if message.startswith(CONTROL_PREFIX):  # steps in flight end first
                while pending:
                    _finish(runner, conn, pending.popleft())
                reply = _control(runner, setup, pickle.loads(message[len(CONTROL_PREFIX):]))
                conn.send_bytes(pickle.dumps(reply))
                continue
            pending.append(runner.launch(decode_step(message)))
        except BaseException:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
            break
    pending.clear()
    runner.graphs = None  # graphs that captured NCCL collectives block destroy_process_group
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
