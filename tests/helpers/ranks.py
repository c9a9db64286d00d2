"""Rank processes for tests that drive torch.distributed themselves: forked from the
workers' fork server (executor/process_start.py), whose imports are done, instead of
interpreters spawned to import torch again (seconds each on the CI's 2 cores)."""
import socket
import traceback
from multiprocessing.connection import wait

from parashift.executor import process_start

TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, world: int, *args, timeout_s: float = TIMEOUT_S) -> None:
    """Runs fn(rank, *args) in `world` processes, as torch.multiprocessing.spawn does: once
    one fails, the others are killed (they may wait on it in a collective) and its traceback
    is raised here."""
    ctx = process_start.worker_context()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    procs = [process_start.worker_process(ctx, _run_rank, (fn, rank, args, pipes[rank][1]),
                                          name=f"test-rank-{rank}") for rank in range(world)]
    for proc in procs:
        proc.start()
    for _, sender in pipes:
        sender.close()
    try:
        _await(procs, [receiver for receiver, _ in pipes], timeout_s)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()


def _await(procs, receivers, timeout_s: float) -> None:
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while running:
        ended = wait(list(running), timeout_s)
        if not ended:
            raise AssertionError(f"ranks {sorted(running.values())} still running after "
                                 f"{timeout_s:.0f} s")
        for sentinel in ended:
            rank = running.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                error = receivers[rank].recv() if receivers[rank].poll() else ""
                raise AssertionError(f"rank {rank} failed (exit code {procs[rank].exitcode})"
                                     f"\n{error}")


def _run_rank(fn, rank: int, args: tuple, report) -> None:
    """In the rank's process: fn's traceback, if it raises, goes to the parent."""
    try:
        fn(rank, *args)
    except BaseException:
        report.send(traceback.format_exc())
        raise SystemExit(1)
    finally:
        report.close()
