"""What `parashift serve --node-rank i` (i > 0) runs: this host's ranks, and nothing else.

The agent connects to node 0's control port (master port + 1), receives the workers' spec
(node 0 resolved the model and the layout), starts one worker process per local rank and
reports their heartbeats and exit codes every HEARTBEAT_INTERVAL_S. Each worker opens its
own connection to node 0 and serves steps on it as a local worker serves its pipe. The
agent ends (and its workers with it) when node 0 shuts it down or is lost."""
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import threading
import time

from parashift.executor.node_link import connect
from parashift.parallel.topology import Topology
from parashift.worker.worker import HEARTBEAT_INTERVAL_S, worker_main

logger = logging.getLogger(__name__)


def run_node_agent(nnodes: int, node_rank: int, master_addr: str, master_port: int,
                   timeout_s: float = 600.0) -> int:
    """Serves this host's ranks until node 0 ends them; the exit status for the CLI
    (0 after node 0's shutdown, 1 once node 0 is lost)."""
    address = (master_addr, master_port + 1)
    link = connect(address, ("agent", node_rank), timeout_s)
    spec = link.recv()
    topology = Topology.for_world(spec.layout.world_size, nnodes, spec.config.gpus_per_node)
    ranks = list(topology.ranks_of(node_rank))
    ctx = mp.get_context("spawn")
    heartbeats = ctx.RawArray("d", spec.layout.world_size)
    procs = {rank: ctx.Process(target=remote_worker_main,
                               args=(rank, spec, address, heartbeats, os.getpid()),
                               daemon=True, name=f"parashift-worker-{rank}")
             for rank in ranks}
    for proc in procs.values():
        proc.start()
    logger.warning("node %d: ranks %s started, driven by %s:%d", node_rank, ranks, *address)
    try:
        return _report(link, procs, heartbeats)
    finally:
        _stop(procs, grace_s=1.0)


def _report(link, procs: dict, heartbeats) -> int:
    """Beats for every local rank until node 0 says shut down (0) or is gone (1)."""
    while True:
        now = time.monotonic()
        report = {rank: (proc.exitcode, now - heartbeats[rank] if heartbeats[rank] else None)
                  for rank, proc in procs.items()}
        try:
            link.send(("beat", report))
            if not link.poll(HEARTBEAT_INTERVAL_S):
                continue
            kind, argument = link.recv()
        except (EOFError, OSError):
            logger.error("node 0 is gone: stopping this host's ranks")
            return 1
        if kind == "kill":
            procs[argument].kill()
        elif kind == "shutdown":
            _stop(procs, grace_s=argument)
            return 0


def _stop(procs: dict, grace_s: float) -> None:
    """Lets the workers end (node 0 sent each its shutdown); kills those still running."""
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def remote_worker_main(rank: int, spec, address, heartbeats, agent_pid: int) -> None:
    """A worker whose step channel is a TCP connection to node 0; it ends with its agent."""
    _die_with(agent_pid)
    conn = connect(address, ("rank", rank))
    worker_main(rank, spec, conn, heartbeats)


def _die_with(parent_pid: int) -> None:
    """Killed with its agent (Linux's parent-death signal), else once its parent is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="parashift-parent-watch").start()
