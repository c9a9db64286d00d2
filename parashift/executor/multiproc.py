"""Runs each rank in its own process and drives them over local pipes.

A step goes to the ranks of the plan it runs under and its result comes back from
that plan's output rank whenever it is ready, so no replica waits for another. A
rank runs the steps it is sent in order: steps of plans that share ranks (a merged
group's and the requests its ranks wrote before the merge) interleave, and two
collective steps meet every rank they share in the same order."""
import multiprocessing as mp
from collections import deque
import pickle
import signal
import socket
import time
from multiprocessing.connection import wait

from parashift.worker.model_runner import ModelRunner
from parashift.worker.step_batch import StepBatch
from parashift.worker.step_codec import encode_step
from parashift.worker.worker import CONTROL_PREFIX, WorkerSpec, worker_main


class WorkerFailure(RuntimeError):
    pass


HEALTH_CHECK_S = 0.5  # while waiting for a worker, how often to check every rank's health


class MultiprocExecutor:
    def __init__(self, spec: WorkerSpec, timeout_s: float, heartbeat_timeout_s: float = 10.0):
        self.layout, self.timeout_s = spec.layout, timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.failure: WorkerFailure | None = None
        spec.master_port = _free_port()
        ctx = mp.get_context("spawn")
        # each rank's last heartbeat (time.monotonic()); 0 until its thread first beats
        self.heartbeats = ctx.RawArray("d", self.layout.world_size)
        self.procs, self.conns = [], []
        for rank in range(self.layout.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(rank, spec, child, self.heartbeats),
                               daemon=True, name=f"parashift-worker-{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        self.rank_blocks, self.load_seconds = self._await_ready()
        self.pending = [deque() for _ in range(self.layout.world_size)]  # by output rank

    def _await_ready(self) -> tuple[list[int], float]:
        """Each rank's KV blocks, and the slowest rank's loading seconds."""
        blocks, seconds = [0] * self.layout.world_size, 0.0
        for rank in range(self.layout.world_size):
            message = self._receive_start(rank)
            if message[0] != "ready":
                self._fail(f"worker rank {rank} failed to start:\n{message[1]}")
            blocks[rank], seconds = message[1], max(seconds, message[2])
        return blocks, seconds

    def check_health(self) -> None:
        """Raises WorkerFailure, naming the rank and why, once a worker process has ended or
        its heartbeat is older than `heartbeat_timeout_s` (stopped, frozen). Cheap (nothing
        is sent to a worker): the engine calls it while idle, and every wait for a worker
        does, so a dead rank is seen within seconds whether or not steps run."""
        if self.failure is not None:
            raise self.failure
        now = time.monotonic()
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                self._fail(self._death(rank))
            beat = self.heartbeats[rank]
            if beat and now - beat > self.heartbeat_timeout_s:
                proc.kill()  # declared dead: it must not come back (SIGKILL ends a stopped one)
                self._fail(f"worker rank {rank} stopped answering: no heartbeat for "
                           f"{now - beat:.1f} s (worker_heartbeat_timeout_s is "
                           f"{self.heartbeat_timeout_s:g})")

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch: StepBatch) -> None:
        """Sends a step to `ranks`; wait_any() returns its result with `tag`."""
        if self.failure is not None:  # its workers are gone: say why, again
            raise self.failure
        payload = encode_step(batch)  # a fixed binary layout: no pickle per step
        for rank in ranks:
            self.conns[rank].send_bytes(payload)
        self.pending[output_rank].append(tag)

    def transition(self, ranks: list[int], verb: str, plan_names: list[str],
                   epoch: int = 0) -> float:
        """One phase of a transition on these ranks (rank i takes plan_names[i]; `epoch`
        counts the engine's transitions); waits for every one of them and returns the
        slowest's seconds. The engine sends it only when none of these ranks has a step in
        flight."""
        messages = [("transition", verb, name, epoch) for name in plan_names]
        return max(self._control(ranks, messages, f"a transition ({verb})"))

    def collective_rpc(self, method: str, *args) -> list:
        """Runs `ModelRunner.<method>(*args)` on every rank while no step is in flight;
        returns each rank's result, in rank order (vLLM's name)."""
        if not callable(getattr(ModelRunner, method, None)):
            raise ValueError(f"ModelRunner has no method {method!r}")
        if any(self.pending):
            raise RuntimeError("collective_rpc runs only while no step is in flight")
        ranks = list(range(self.layout.world_size))
        return self._control(ranks, [("rpc", method, args)] * len(ranks), f"rpc {method}")

    def _control(self, ranks: list[int], messages: list[tuple], what: str) -> list:
        """Sends rank i messages[i] (a control message) and waits for every answer."""
        if self.failure is not None:
            raise self.failure
        for rank, message in zip(ranks, messages):
            self.conns[rank].send_bytes(CONTROL_PREFIX + pickle.dumps(message))
        answers, deadline = [], time.monotonic() + self.timeout_s
        for rank in ranks:
            if not self._wait([self.conns[rank]], deadline):
                self._fail(f"worker rank {rank} did not finish {what} within "
                           f"{self.timeout_s:.0f} s: a worker hung")
            kind, payload = self._read(rank)
            if kind == "error":
                self._fail(f"worker rank {rank} failed in {what}:\n{payload}")
            answers.append(payload)
        return answers

    def wait_any(self) -> list[tuple[int, object]]:
        """(tag, result) of steps in flight: waits until at least one is ready. Every rank
        is watched (a rank that is no step's output rank wakes the wait only with an error,
        or when it dies and its pipe closes)."""
        deadline = time.monotonic() + self.timeout_s
        watched = {conn: r for r, conn in enumerate(self.conns)}
        ready = self._wait(list(watched), deadline)
        if not ready:
            self._fail(f"a step did not finish within {self.timeout_s:.0f} s: a worker hung")
        return [self._result(watched[conn]) for conn in ready]

    def _wait(self, conns: list, deadline: float) -> list:
        """The conns ready to read ([] past the deadline). Waits in slices of HEALTH_CHECK_S,
        checking every rank's health between them: a step whose worker died or stopped
        fails within seconds, not at the deadline (`worker_timeout_s`, for a worker that
        beats but hangs, e.g. in a collective)."""
        while True:
            self.check_health()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            ready = wait(conns, timeout=min(HEALTH_CHECK_S, remaining))
            if ready:
                return ready

    def _result(self, rank: int) -> tuple[object, object]:
        """The step result `rank` sent, with its tag (a rank's results come in order)."""
        kind, payload = self._read(rank)
        if kind == "error":
            self._fail(f"worker rank {rank} failed:\n{payload}")
        if not self.pending[rank]:
            self._fail(f"worker rank {rank} sent a result no step waits for")
        return self.pending[rank].popleft(), payload

    def _read(self, rank: int) -> tuple[str, object]:
        try:
            return pickle.loads(self.conns[rank].recv_bytes())
        except (EOFError, OSError):  # its end of the pipe closed: the process is gone
            self._fail(self._death(rank))

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
            self._fail(f"worker rank {rank} did not start within {self.timeout_s:.0f} s")
        if conn not in ready:
            self._fail(f"worker rank {rank} died during start-up ({_exit_status(proc)})")
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self._fail(f"worker rank {rank} died during start-up ({_exit_status(proc)})")

    def _fail(self, message: str):
        """Stops every worker; this failure is raised now and by every later check_health().
        A rank that was killed or crashed is named first: the error of a peer whose
        collective it cut short only follows from it."""
        self.failure = WorkerFailure("\n".join([*self._other_deaths(message), message]))
        self.shutdown(grace_s=1)  # the engine is dead: a rank stuck with its peer is killed
        raise self.failure

    def _other_deaths(self, message: str) -> list[str]:
        """How the ranks not named in `message` that were killed or crashed ended, once
        their sentinels have had 0.1 s to show it (a peer can report the collective they
        broke first). A rank that ended with code 0 ended by itself, after its own error."""
        others = {proc.sentinel: (rank, proc) for rank, proc in enumerate(self.procs)
                  if f"worker rank {rank} " not in message}
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
        for proc in self.procs:
            proc.join(timeout=grace_s)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []


def _exit_status(proc) -> str:
    """How a worker's process ended. Its pipe (or sentinel) closes a moment before the
    process can be reaped, when `exitcode` still reads None: join it briefly first."""
    proc.join(timeout=1)
    code = proc.exitcode
    if code is None:
        return "still running 1 s after its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
