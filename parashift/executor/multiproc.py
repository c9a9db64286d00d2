"""Runs each rank in its own process and drives them over local pipes (another host's
ranks over TCP: node_link.py, with the same messages).

A step goes to the ranks of the plan it runs under and its result comes back from
that plan's output rank whenever it is ready, so no replica waits for another. A
rank runs the steps it is sent in order: steps of plans that share ranks (a merged
group's and the requests its ranks wrote before the merge) interleave, and two
collective steps meet every rank they share in the same order."""
import logging
from collections import deque
import pickle
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from parashift.executor.base import TransitionAborted, WorkerFailure, first_line
from parashift.executor.node_link import NodeLink, accept_nodes
from parashift.executor.process_start import exit_status as _exit_status
from parashift.executor.process_start import is_stopped as _is_stopped, reap as _reap
from parashift.executor.process_start import worker_context, worker_process
from parashift.executor.replacement import Hosts, Outcome, Replacements, host_store
from parashift.executor.world_reform import reform_world
from parashift.step.codec import encode_step
from parashift.step.message import StepBatch
from parashift.worker.model_runner import ModelRunner
from parashift.worker.worker import CONTROL_PREFIX, WorkerSpec, worker_main

logger = logging.getLogger(__name__)


HEALTH_CHECK_S = 0.2  # while waiting for a worker, how often to check every rank's health
STOPPED_TIMEOUT_S = 1.0  # a stopped process (SIGSTOP, the kernel's "T") silent this long is dead


class MultiprocExecutor:
    """A rank that dies, stops or fails is lost alone: it is killed for good (SIGKILL),
    no step goes to it again, the steps whose result it owed are dropped, and the engine
    takes it (`take_lost`) and takes its group out of service. Only the engine decides
    that nothing can serve any more (`fail`)."""

    def __init__(self, spec: WorkerSpec, timeout_s: float, heartbeat_timeout_s: float = 10.0,
                 step_timeout_s: float = 60.0):
        self.layout, self.timeout_s = spec.layout, timeout_s
        self.heartbeat_timeout_s, self.step_timeout_s = heartbeat_timeout_s, step_timeout_s
        self.stopped_timeout_s = min(STOPPED_TIMEOUT_S, heartbeat_timeout_s)
        self.failure: WorkerFailure | None = None
        self.lost: dict[int, str] = {}  # rank -> why, in the order they were lost
        self._unreported: dict[int, str] = {}  # lost since the engine last took them
        ctx = worker_context()
        # each rank's last heartbeat (time.monotonic()); 0 until its thread first beats
        self.heartbeats = ctx.RawArray("d", self.layout.world_size)
        self.procs, self.conns = [], []  # by rank; another host's: RemoteRank, TCP
        self._host_store(spec)
        self.links = self._start_ranks(ctx, spec)
        self.replacements = Replacements(ctx, spec, self.heartbeats, timeout_s)
        self.hosts = (Hosts(self.links, spec.config.topology, self.heartbeats,
                            ("", spec.config.master_port + 1))
                      if self.links and isinstance(self.links[0], NodeLink) else None)
        self._replaced: list[Outcome] = []  # attempts ended since the engine last took them
        # by output rank: (tag, the step's ranks, when it was sent)
        self.pending = [deque() for _ in range(self.layout.world_size)]
        self.rank_blocks, self.load_seconds = self._await_ready()

    def _start_ranks(self, ctx, spec: WorkerSpec) -> list:
        """Every rank started (RayExecutor: as Ray actors); the links to drive them by."""
        return self._start_processes(ctx, spec)

    def _start_processes(self, ctx, spec: WorkerSpec) -> list[NodeLink]:
        """This host's ranks as child processes, then the other hosts' (their agents')."""
        if spec.config.node_rank != 0:
            raise ValueError(f"node_rank {spec.config.node_rank} runs no engine: start it "
                             "with `parashift serve`, which runs only that host's ranks")
        topology = spec.config.topology
        for rank in topology.ranks_of(0):
            parent, child = ctx.Pipe()
            proc = worker_process(ctx, worker_main, (rank, spec, child, self.heartbeats),
                                  name=f"parashift-worker-{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        return self._connect_hosts(spec, topology) if topology.nnodes > 1 else []

    def _host_store(self, spec: WorkerSpec) -> None:
        """The rendezvous store, in this process (replacement.py): on node 0's master port
        across hosts, else on a free one."""
        if spec.config.topology.nnodes > 1:  # every host's ranks meet at node 0's store
            spec.master_addr, spec.master_port = spec.config.master_addr, spec.config.master_port
        self.store = host_store(spec.master_addr, spec.master_port, self.timeout_s)
        spec.master_port = self.store.port

    def _connect_hosts(self, spec: WorkerSpec, topology) -> list[NodeLink]:
        """Every other host's ranks, driven over TCP (node_link.py) as the local ones are
        over pipes."""
        try:
            links, conns = accept_nodes(("", spec.config.master_port + 1), spec, topology,
                                        self.heartbeats, self.timeout_s)
        except (TimeoutError, OSError) as e:
            self.fail(f"the other hosts did not join: {e}")
        for link in links:
            for rank, remote in link.ranks.items():
                self.procs.append(remote)
                self.conns.append(conns[rank])
        return links

    def _await_ready(self) -> tuple[list[int], float]:
        """Each rank's KV blocks, and the slowest rank's loading seconds."""
        blocks, seconds = [0] * self.layout.world_size, 0.0
        for rank in range(self.layout.world_size):
            message = self._receive_start(rank)
            if message[0] != "ready":
                self.fail(f"worker rank {rank} failed to start:\n{message[1]}")
            blocks[rank], seconds = message[1], max(seconds, message[2])
        return blocks, seconds

    @property
    def alive(self) -> list[int]:
        return [rank for rank in range(len(self.procs)) if rank not in self.lost]

    @property
    def local_runner(self) -> None:
        """None: the model runs in the ranks' processes."""
        return None

    def check_health(self) -> None:
        """Loses each rank whose process has ended, or whose heartbeat is older than
        `heartbeat_timeout_s` (frozen), or than `stopped_timeout_s` while the kernel says it
        is stopped (SIGSTOP). Cheap (nothing is sent to a worker): the engine calls it while
        idle, and every wait for a worker does. Raises once the engine has failed."""
        if self.failure is not None:
            raise self.failure
        now = time.monotonic()
        for rank in self.alive:
            proc, beat = self.procs[rank], self.heartbeats[rank]
            silent = now - beat if beat else 0.0
            if proc.exitcode is not None:
                self._lose(rank, self._death(rank))
            elif silent > self.heartbeat_timeout_s:
                self._lose(rank, f"worker rank {rank} stopped answering: no heartbeat for "
                                 f"{silent:.1f} s (worker_heartbeat_timeout_s is "
                                 f"{self.heartbeat_timeout_s:g})")
            elif silent > self.stopped_timeout_s and _is_stopped(proc.pid):
                self._lose(rank, f"worker rank {rank} stopped answering: no heartbeat for "
                                 f"{silent:.1f} s (its process is stopped)")

    def take_lost(self) -> dict[int, str]:
        """The ranks lost since the last call, with why."""
        lost, self._unreported = self._unreported, {}
        return lost

    def replace(self, ranks: tuple[int, ...]) -> None:
        """Starts new processes for lost `ranks` (every rank of the groups lost), which
        meet at a new rendezvous (replacement.py); `take_replaced` says how it ended."""
        remote = [r for r in ranks if not isinstance(self.procs[r], BaseProcess)]
        if remote and self.hosts is None:
            raise ValueError(f"ranks {remote} are not this host's and no agent can start "
                             "them")
        if self.hosts is not None:
            self.hosts.check_up(ranks)  # HostDown: the engine asks again later
        self.replacements.start(tuple(ranks), self.hosts)

    def take_replaced(self) -> list[Outcome]:
        """The replacements that ended since the last call; those whose ranks all started
        serve again (alive, steps go to them)."""
        for attempt, outcome in self.replacements.take():
            if outcome.ok:
                for rank, (proc, conn) in attempt.workers.items():
                    self.conns[rank].close()
                    self.procs[rank], self.conns[rank] = proc, conn
                    self.rank_blocks[rank] = outcome.blocks[rank]
                    self.pending[rank].clear()
                    del self.lost[rank]
            self._replaced.append(outcome)
        replaced, self._replaced = self._replaced, []
        return replaced

    @property
    def can_reform(self) -> bool:
        """One host's processes re-form one world once replaced ranks serve (world_reform.py);
        other hosts' ranks and Ray actors keep the worlds they were started in."""
        return self.hosts is None and not self.links

    def reform(self, members: tuple[int, ...]) -> bool:
        """Every rank of `members` (no step in flight) leaves its torch world and joins one
        new world with the others; False if a rank was lost meanwhile (the others keep
        their worlds; `take_lost` says which)."""
        return reform_world(self, members)

    def retire(self, ranks, reason: str) -> None:
        """Loses live `ranks` on the engine's word (their group lost another rank: a
        communicator with a dead peer hangs or fails, so they cannot step again)."""
        for rank in ranks:
            if rank in self.lost:
                continue
            if self.procs[rank].exitcode is not None:  # it had died: say how
                self._lose(rank, self._death(rank), report=False)
            else:
                self._lose(rank, reason, report=False)

    def _lose(self, rank: int, reason: str, report: bool = True) -> None:
        """Kills `rank` for good (a stopped one too) and drops the steps it owed."""
        logger.error("%s; its group is taken out of service", reason.splitlines()[0])
        self.procs[rank].kill()
        _reap(self.procs[rank])
        self.lost[rank] = reason
        self.pending[rank].clear()
        if report:
            self._unreported[rank] = reason

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch: StepBatch) -> None:
        """Sends a step to `ranks`; wait_any() returns its result with `tag`. A rank found
        dead while sending is lost (the engine takes the step's group out with it)."""
        if self.failure is not None:  # its workers are gone: say why, again
            raise self.failure
        if any(rank in self.lost for rank in ranks):
            return  # lost in this round of submissions: the engine takes the group out next
        payload = encode_step(batch)  # a fixed binary layout: no pickle per step
        for rank in ranks:
            try:
                self.conns[rank].send_bytes(payload)
            except OSError:
                self._lose(rank, self._death(rank))
        if output_rank not in self.lost:
            self.pending[output_rank].append((tag, tuple(ranks), time.monotonic()))

    def transition(self, ranks: list[int], verb: str, plan_names: list[str],
                   epoch: int = 0) -> float:
        """One phase of a transition on these ranks (rank i takes plan_names[i]; `epoch`
        counts the engine's transitions); waits for every one of them and returns the
        slowest's seconds. The engine sends it only when none of these ranks has a step in
        flight."""
        messages = [("transition", verb, name, epoch) for name in plan_names]
        return max(self._control(ranks, messages, f"a transition ({verb})"))

    def seesaw_move(self, ranks: list[int], verb: str, plan_names: list[str], moves: list,
                    tier) -> list[dict]:
        """One phase of a seesaw transition's KV and weight moves on these ranks (rank i
        takes plan_names[i]; ModelRunner.seesaw_move); each rank's stats."""
        messages = [("seesaw", verb, name, moves, tier) for name in plan_names]
        return self._control(ranks, messages, f"a seesaw move ({verb})")

    def collective_rpc(self, method: str, *args) -> list:
        """Runs `ModelRunner.<method>(*args)` on every live rank while no step is in
        flight; returns each rank's result, in rank order (None for a lost rank; vLLM's
        name)."""
        if not callable(getattr(ModelRunner, method, None)):
            raise ValueError(f"ModelRunner has no method {method!r}")
        if any(self.pending):
            raise RuntimeError("collective_rpc runs only while no step is in flight")
        ranks = self.alive
        answers = dict(zip(ranks, self._control(ranks, [("rpc", method, args)] * len(ranks),
                                                f"rpc {method}")))
        return [answers.get(rank) for rank in range(len(self.procs))]

    def _control(self, ranks: list[int], messages: list[tuple], what: str) -> list:
        """Sends rank i messages[i] (a control message) and waits for every answer. A rank
        of these lost meanwhile (dead, failed, hung) aborts it: every one of `ranks` is lost
        (a transition half made on their groups) and TransitionAborted is raised."""
        if self.failure is not None:
            raise self.failure
        for rank, message in zip(ranks, messages):
            try:
                self.conns[rank].send_bytes(CONTROL_PREFIX + pickle.dumps(message))
            except OSError:
                self._lose(rank, self._death(rank))
        answers, deadline = [], time.monotonic() + self.timeout_s
        for rank in ranks:
            ready = self._wait([self.conns[rank]], deadline, watch=ranks)
            message = self._read(rank) if ready and rank not in self.lost else None
            if message is None or message[0] == "error":
                culprit = next((r for r in ranks if r in self.lost), rank)
                self._abort(ranks, culprit, what, message, bool(ready) or culprit != rank)
            answers.append(message[1])
        return answers

    def _abort(self, ranks: list[int], rank: int, what: str, message, answered: bool):
        why = (self.lost.get(rank) or (f"worker rank {rank} failed in {what}:\n{message[1]}"
                                       if answered else f"worker rank {rank} did not finish "
                                       f"{what} within {self.timeout_s:.0f} s: a worker hung"))
        if rank not in self.lost:
            self._lose(rank, why)
        for other in ranks:
            if other not in self.lost:
                self._lose(other, f"worker rank {other} taken out: {what} aborted "
                                  f"({first_line(why)})")
        raise TransitionAborted(f"{first_line(why)} (during {what})")

    def wait_any(self) -> list[tuple[object, object]]:
        """(tag, result) of steps in flight: waits until at least one is ready or a rank is
        lost (then it may return none: the engine takes the loss). Every live rank is
        watched (a rank that is no step's output rank wakes the wait only with an error, or
        when it dies and its pipe closes). A step older than `step_timeout_s` loses its
        ranks (they beat but hang, e.g. in a collective)."""
        watched = {self.conns[r]: r for r in self.alive}
        ready = self._wait(list(watched), deadline=None, until_lost=True)
        results = []
        for conn in ready:
            result = self._result(watched[conn])
            if result is not None:
                results.append(result)
        return results

    def _wait(self, conns: list, deadline: float | None, until_lost: bool = False,
              watch=()) -> list:
        """The conns ready to read ([] past the deadline, or `until_lost`, once a rank was
        lost, or once a rank of `watch` is). Waits in
        slices of HEALTH_CHECK_S, checking every rank's health and the age of every step
        between them: a step whose worker died or stopped ends the wait within a second."""
        while True:
            self.check_health()
            self._time_out_steps()
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if (remaining <= 0 or (until_lost and self._unreported)
                    or any(rank in self.lost for rank in watch)):
                return []
            ready = wait(conns, timeout=min(HEALTH_CHECK_S, remaining))
            if ready:
                return ready

    def _time_out_steps(self) -> None:
        now = time.monotonic()
        for rank in self.alive:
            if self.pending[rank] and now - self.pending[rank][0][2] > self.step_timeout_s:
                _, ranks, _ = self.pending[rank][0]
                reason = (f"a step on worker ranks {list(ranks)} did not finish within "
                          f"{self.step_timeout_s:g} s (worker_step_timeout_s): a worker hung")
                for r in ranks:
                    if r not in self.lost:
                        self._lose(r, reason)

    def _result(self, rank: int) -> tuple[object, object] | None:
        """The step result `rank` sent, with its tag (a rank's results come in order);
        None where it failed instead (it is lost)."""
        message = self._read(rank)
        if message is None:
            return None
        kind, payload = message
        if kind == "error":
            self._lose_ended_peers(rank)
            self._lose(rank, f"worker rank {rank} failed:\n{payload}")
            return None
        if not self.pending[rank]:
            self._lose(rank, f"worker rank {rank} sent a result no step waits for")
            return None
        return self.pending[rank].popleft()[0], payload

    def _lose_ended_peers(self, rank: int) -> None:
        """The ranks killed or crashed, once their sentinels have had 0.1 s to show it: a
        peer's error about the collective a death broke comes first at times, and the rank
        that died is named first."""
        others = {self.procs[r].sentinel: r for r in self.alive if r != rank}
        for sentinel in wait(list(others), timeout=0.1):
            self._lose(others[sentinel], self._death(others[sentinel]))

    def _read(self, rank: int) -> tuple[str, object] | None:
        """Its next message; None once its pipe closed (the process is gone: lost)."""
        try:
            return pickle.loads(self.conns[rank].recv_bytes())
        except (EOFError, OSError):
            self._lose(rank, self._death(rank))
            return None

    def _death(self, rank: int) -> str:
        """Why `rank`'s process ended: the error it sent before ending, if one is still
        unread (a traceback says more than "exit code 0"), else how it ended."""
        conn = self.conns[rank]
        try:
            if conn.poll():
                kind, payload = pickle.loads(conn.recv_bytes())
                if kind == "error":
                    return f"worker rank {rank} failed:\n{payload}"
        except (EOFError, OSError):
            pass
        return f"worker rank {rank} died ({_exit_status(self.procs[rank])})"

    def _receive_start(self, rank: int):
        """Its ready (or error) message. Only this rank's own process is watched: a rank
        that fails to start sends its error and ends, which is no reason to fail another's
        wait before that error is read; the slowest start is bounded by `timeout_s`."""
        conn, proc = self.conns[rank], self.procs[rank]
        ready = wait([conn, proc.sentinel], self.timeout_s)
        if not ready:
            self.fail(f"worker rank {rank} did not start within {self.timeout_s:.0f} s")
        if conn not in ready:
            self.fail(f"worker rank {rank} died during start-up ({_exit_status(proc)})")
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self.fail(f"worker rank {rank} died during start-up ({_exit_status(proc)})")

    def fail(self, message: str):
        """Stops every worker; this failure is raised now and by every later check_health().
        A rank that was killed or crashed is named first: the error of a peer whose
        collective it cut short only follows from it."""
        self.failure = WorkerFailure("\n".join([*self._other_deaths(message), message]))
        self.shutdown(grace_s=1)  # the engine is dead: a rank stuck with its peer is killed
        raise self.failure

    def _other_deaths(self, message: str) -> list[str]:
        """How the ranks not named in `message` that were killed or crashed ended, once
        their sentinels have had 0.1 s to show it (a peer can report the collective they
        broke first). A rank that ended with code 0 ended by itself, after its own error;
        one this executor lost is left out (the engine's message names it)."""
        others = {proc.sentinel: (rank, proc) for rank, proc in enumerate(self.procs)
                  if f"worker rank {rank} " not in message and rank not in self.lost}
        ended = [others[sentinel] for sentinel in wait(list(others), timeout=0.1)]
        statuses = [(rank, _exit_status(proc)) for rank, proc in ended]
        return [f"worker rank {rank} died ({status})" for rank, status in statuses
                if status != "exit code 0"]

    def shutdown(self, grace_s: float = 5) -> None:
        """Asks every worker to stop; kills those still running after `grace_s`."""
        for conn, proc in zip(self.conns, self.procs):
            if proc.is_alive():
                try:
                    conn.send_bytes(b"shutdown")
                except OSError:
                    pass
        if hasattr(self, "replacements"):
            self.replacements.shutdown()
        hosts = getattr(self, "hosts", None)
        for link in hosts.links.values() if hosts else getattr(self, "links", ()):
            link.shutdown(grace_s)  # their agents end their ranks
        if hosts is not None:
            hosts.shutdown(grace_s)
        for proc in self.procs:
            proc.join(timeout=grace_s)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
