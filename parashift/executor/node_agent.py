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
    agent = _Agent(link, address)  # it reports (nothing yet) while the spec is read
    try:
        spec = link.recv()  # a host that rejoins gets a replacement's (generation, members)
        topology = Topology.for_world(spec.layout.world_size, nnodes, spec.config.gpus_per_node)
        ranks = [r for r in topology.ranks_of(node_rank) if r in (spec.members or (r,))]
        agent.heartbeats = agent.ctx.RawArray("d", spec.layout.world_size)
        agent.start(spec, ranks)
        logger.warning("node %d: ranks %s started, driven by %s:%d", node_rank, ranks, *address)
        return agent.report()
    finally:
        agent.gone.set()
        _stop(agent.procs, grace_s=1.0)


class _Agent:
    """This host's worker processes by rank, each with the rendezvous generation it joined
    (node 0 tells a report of a replaced process from its replacement's by it). A thread
    reports while processes start (a spawn takes seconds under load: node 0 would take the
    silence for a lost host)."""

    def __init__(self, link, address):
        self.link, self.address, self.ctx = link, address, mp.get_context("spawn")
        self.heartbeats = None  # one slot per rank of the world, once the spec says how many
        self.procs, self.generations = {}, {}
        self._lock = threading.Lock()  # the procs, and sends on the link
        self.gone = threading.Event()  # node 0 is gone
        threading.Thread(target=self._beat, daemon=True, name="parashift-agent-beat").start()

    def start(self, spec, ranks) -> None:
        started = {}
        for rank in ranks:
            started[rank] = self.ctx.Process(
                target=remote_worker_main,
                args=(rank, spec, self.address, self.heartbeats, os.getpid()),
                daemon=True, name=f"parashift-worker-{rank}")
            started[rank].start()
        with self._lock:
            for rank, proc in started.items():
                self.heartbeats[rank] = 0.0
                self.procs[rank], self.generations[rank] = proc, spec.generation

    def _beat(self) -> None:
        while not self.gone.is_set():
            now, beats = time.monotonic(), self.heartbeats
            with self._lock:
                report = {rank: (proc.exitcode, now - beats[rank] if beats[rank] else None,
                                 self.generations[rank]) for rank, proc in self.procs.items()}
                try:
                    self.link.send(("beat", report))
                except (EOFError, OSError):
                    self.gone.set()
            time.sleep(HEARTBEAT_INTERVAL_S)

    def report(self) -> int:
        """Until node 0 says shut down (0) or is gone (1); starts the replacements node 0
        asks for."""
        while True:
            try:
                if not self.link.poll(HEARTBEAT_INTERVAL_S):
                    if self.gone.is_set():
                        raise EOFError
                    continue
                kind, argument = self.link.recv()
            except (EOFError, OSError):
                logger.error("node 0 is gone: stopping this host's ranks")
                return 1
            if kind == "kill":
                self.procs[argument].kill()
            elif kind == "start":  # (spec, ranks): replacements
                _stop({r: self.procs[r] for r in argument[1] if r in self.procs}, grace_s=0.0)
                self.start(*argument)
            elif kind == "shutdown":
                self.gone.set()
                _stop(self.procs, grace_s=argument)
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
