"""A helper process of the engine's (the output processor's, the engine core's): a fresh
interpreter, as multiprocessing's spawn starts one (CUDA may be initialised here, and
nothing of this process is forked), started without importing this process's main module,
and the two pipes to it."""
import os
import subprocess
import sys
from multiprocessing.connection import Connection

POLL_S = 1.0  # how often a blocked read checks that the child lives


def start_child(module: str) -> tuple[subprocess.Popen, Connection, Connection]:
    """`python -m module INBOX_FD OUTBOX_FD` with this process's import path; its process,
    the pipe to it and the pipe from it."""
    inbox, to_child = os.pipe()
    from_child, outbox = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-m", module, str(inbox), str(outbox)],
                               pass_fds=(inbox, outbox), env=env, stdin=subprocess.DEVNULL)
    os.close(inbox)
    os.close(outbox)  # the child's ends only: its death reads as the end of the pipe
    return process, Connection(to_child, readable=False), Connection(from_child, writable=False)


def receive(process: subprocess.Popen, connection: Connection):
    """The child's next message; EOFError once it has died (or closed its end)."""
    try:
        while not connection.poll(POLL_S):
            if process.poll() is not None:
                raise EOFError
        return connection.recv()
    except OSError:
        raise EOFError from None


def stop_child(process: subprocess.Popen, timeout: float) -> None:
    """Waits for the child to leave (it was told to), killing it after `timeout`."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
