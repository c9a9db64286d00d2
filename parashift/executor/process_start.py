"""How a worker process starts: forked from a fork server that has already imported what a
worker imports (torch, parashift's worker, transformers' config classes), so a start costs
milliseconds instead of seconds of imports. The server is started once per process, on the
first worker's start, and serves every later one.

The server only imports: nothing in it touches CUDA (a forked child could not use a
device its parent had initialised). A child gets its parent's present working directory and
import path (multiprocessing sends them), its environment and its standard output and error
(sent here), as a spawned one would. parashift's modules read some PARASHIFT_ variables when
they are imported: where one differs from what the server imported under, a worker is spawned
instead (as before the server existed), so it imports under the environment it is given."""
import multiprocessing as mp
import os
import signal
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import DupFd

PRELOAD = ("parashift.executor.fork_server_imports",)  # what a worker imports


def _import_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("PARASHIFT_")}


# This process's settings when parashift's executor was imported: the fork server imports
# under them (it starts with the first worker that starts under them).
_SERVER_SETTINGS = _import_settings()


def worker_context():
    """The multiprocessing context to start workers with (its Pipe and RawArray too): the
    fork server's where it can serve this environment, else spawn's."""
    if ("forkserver" not in mp.get_all_start_methods()
            or _import_settings() != _SERVER_SETTINGS):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read only when the server starts
    return ctx


def worker_process(ctx, target, args: tuple, name: str):
    """A daemon process (not started) running `target(*args)` under this process's
    environment and standard output and error."""
    if ctx.get_start_method() != "forkserver":
        return ctx.Process(target=target, args=args, daemon=True, name=name)
    inherited = (dict(os.environ), _StandardStream(1), _StandardStream(2))
    return ctx.Process(target=_run_as_spawned, args=(inherited, target, args), daemon=True,
                       name=name)


def _run_as_spawned(inherited, target, args: tuple) -> None:
    """In the forked child: takes the parent's environment and standard streams, then runs."""
    environment, stdout, stderr = inherited
    os.environ.clear()
    os.environ.update(environment)
    for duplicate, fd in ((stdout, 1), (stderr, 2)):
        os.dup2(duplicate, fd)
        os.close(duplicate)
    target(*args)


class _StandardStream:
    """The parent's file descriptor `fd`, sent to the child with the process (a duplicate)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (DupFd(self.fd),)  # while the process is sent: the fd goes with it


def _detach(duplicate) -> int:
    return duplicate.detach()


def exit_status(proc) -> str:
    """How a worker's process ended. Its pipe (or sentinel) closes a moment before the
    process can be reaped, when `exitcode` still reads None: join it briefly first."""
    proc.join(timeout=1)
    if getattr(proc, "lost_reason", ""):  # another host's rank, with its host
        return proc.lost_reason
    code = proc.exitcode
    if code is None:
        return "still running 1 s after its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def reap(proc) -> None:
    """Waits for a killed process of this host (a child left unwaited stays a zombie for
    as long as the server runs); another host's rank is its agent's to wait for."""
    if isinstance(proc, BaseProcess):
        proc.join(timeout=1)


def is_stopped(pid: int) -> bool:
    """Whether the kernel has the process stopped (SIGSTOP, a debugger): Linux's
    /proc/<pid>/stat state "T" or "t"; False where it cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False
