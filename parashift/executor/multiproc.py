"""Runs each rank in its own process and drives them over local pipes.

Replicas are independent: a step is submitted to one replica's ranks and its
result collected whenever it is ready, so no replica waits for another. Each
group of the node layout serves one replica, or, with pipeline parallelism, PP
replicas that split its KV pool: while stage 1 runs one replica's step, stage 0
already runs the next replica's, so every stage stays busy."""
import multiprocessing as mp
from collections import deque
import pickle
import socket
import time
from multiprocessing.connection import wait

from parashift.worker.step_batch import StepBatch
from parashift.worker.step_codec import encode_step
from parashift.worker.worker import CONTROL_PREFIX, WorkerSpec, worker_main


class WorkerFailure(RuntimeError):
    pass


class MultiprocExecutor:
    def __init__(self, spec: WorkerSpec, timeout_s: float):
        self.layout, self.timeout_s = spec.layout, timeout_s
        spec.master_port = _free_port()
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        for rank in range(self.layout.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(rank, spec, child), daemon=True,
                               name=f"parashift-worker-{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        self.group_ranks = [list(plan.ranks) for plan in self.layout.plans]
        group_blocks, self.load_seconds = self._await_ready()
        # replica -> (its group, first block id, number of blocks)
        self.replicas = []
        for group, plan in enumerate(self.layout.plans):
            parts = self._replicas_per_group(group_blocks[group], plan.pp, spec)
            size = group_blocks[group] // parts
            self.replicas += [(group, k * size, size) for k in range(parts)]
        self.pending = [deque() for _ in self.group_ranks]  # replicas in flight, in order
        self.in_flight: set[int] = set()

    @staticmethod
    def _replicas_per_group(num_blocks: int, parts: int, spec: WorkerSpec) -> int:
        """PP replicas per group when each part of the pool still fits a whole sequence."""
        if (num_blocks // parts) * spec.config.block_size < spec.max_model_len:
            return 1
        return parts

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    @property
    def num_blocks(self) -> list[int]:
        return [n for _, _, n in self.replicas]

    @property
    def block_offsets(self) -> list[int]:
        return [offset for _, offset, _ in self.replicas]

    @property
    def replica_groups(self) -> list[int]:
        return [group for group, _, _ in self.replicas]

    def _await_ready(self) -> tuple[list[int], float]:
        blocks, seconds = [0] * self.layout.world_size, 0.0
        for rank in range(self.layout.world_size):
            message = self._receive(rank, self.timeout_s)
            if message[0] != "ready":
                self._fail(f"worker rank {rank} failed to start:\n{message[1]}")
            blocks[rank], seconds = message[1], max(seconds, message[2])
        return [min(blocks[r] for r in ranks) for ranks in self.group_ranks], seconds

    def submit(self, replica: int, batch: StepBatch) -> None:
        payload = encode_step(batch)  # a fixed binary layout: no pickle per step
        group = self.replicas[replica][0]
        for rank in self.group_ranks[group]:
            self.conns[rank].send_bytes(payload)
        self.pending[group].append(replica)
        self.in_flight.add(replica)

    def transition(self, ranks: list[int], verb: str, plan_names: list[str]) -> float:
        """One phase of a transition on these ranks (rank i takes plan_names[i]); waits
        for every one of them and returns the slowest's seconds. The engine sends it only
        when none of these ranks has a step in flight."""
        for rank, name in zip(ranks, plan_names):
            self.conns[rank].send_bytes(CONTROL_PREFIX + pickle.dumps((verb, name)))
        seconds = 0.0
        for rank in ranks:
            message = self._receive_bytes(rank, self.timeout_s)
            kind, payload = pickle.loads(message)
            if kind == "error":
                self._fail(f"worker rank {rank} failed in a transition ({verb}):\n{payload}")
            seconds = max(seconds, payload)
        return seconds

    def wait_any(self) -> list[tuple[int, object]]:
        """Results of in-flight replicas: waits until at least one is ready."""
        deadline = time.monotonic() + self.timeout_s
        watched = {self.conns[r]: r for group, queue in enumerate(self.pending) if queue
                   for r in self.group_ranks[group]}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs)}
        while True:
            ready = wait(list(watched) + list(sentinels), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._fail(f"a step did not finish within {self.timeout_s:.0f} s: a worker hung")
            results = [self._result(watched[obj]) for obj in ready if obj in watched]
            for obj in ready:  # a process that ended without a message to read
                rank = sentinels.get(obj)
                if rank is not None and self.conns[rank] not in ready:
                    self._fail(f"worker rank {rank} died (exit code {self.procs[rank].exitcode})")
            if results:
                return results

    def _result(self, rank: int) -> tuple[int, object]:
        try:
            kind, payload = pickle.loads(self.conns[rank].recv_bytes())
        except (EOFError, OSError):  # its end of the pipe closed: the process is gone
            self.procs[rank].join(timeout=1)
            self._fail(f"worker rank {rank} died (exit code {self.procs[rank].exitcode})")
        if kind == "error":
            self._fail(f"worker rank {rank} failed:\n{payload}")
        replica = self.pending[self.layout.group_of_rank(rank)].popleft()  # results come in order
        self.in_flight.discard(replica)
        return replica, payload

    def _receive(self, rank: int, timeout: float):
        return pickle.loads(self._receive_bytes(rank, timeout))

    def _receive_bytes(self, rank: int, timeout: float) -> bytes:
        conn, proc = self.conns[rank], self.procs[rank]
        ready = wait([conn, proc.sentinel], timeout)
        if conn in ready:
            return conn.recv_bytes()
        if proc.sentinel in ready:
            self._fail(f"worker rank {rank} died during start-up (exit code {proc.exitcode})")
        self._fail(f"worker rank {rank} did not start within {timeout:.0f} s")

    def _fail(self, message: str):
        self.shutdown()
        raise WorkerFailure(message)

    def shutdown(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            if proc.is_alive():
                try:
                    conn.send_bytes(b"shutdown")
                except OSError:
                    pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
