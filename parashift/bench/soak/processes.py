"""A server's process tree read from Linux's /proc: each process's resident memory, open
file descriptors, threads and state, and which of them are the workers."""
import os
from dataclasses import asdict, dataclass
from pathlib import Path

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    ppid: int
    role: str        # front, resource_tracker, forkserver, worker, or the child's program
    state: str       # /proc/<pid>/stat's state letter: R, S, D, Z (zombie), T (stopped) ...
    rss_kib: int
    fds: int | None  # None where the process is a zombie (its table is gone)
    threads: int
    start_ticks: int  # since boot: tells a replacement from the process whose pid it reused

    def as_dict(self) -> dict:
        return asdict(self)


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(child) for child in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def descendants(root: int) -> list[int]:
    """Every process below `root`, parents before their children."""
    order, frontier = [], [root]
    while frontier:
        children = [child for pid in frontier for child in _children(pid)]
        order.extend(children)
        frontier = children
    return order


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _role(pid: int, root: int, cmdline: str, parent_cmdline: str) -> str:
    if pid == root:
        return "front"
    if "resource_tracker" in cmdline:
        return "resource_tracker"
    if "forkserver" in cmdline:  # a forked child keeps its fork server's command line
        return "worker" if "forkserver" in parent_cmdline else "forkserver"
    if "spawn_main" in cmdline:
        return "worker"
    words = cmdline.split()
    return os.path.basename(words[-1] if words else "?")[:40]


def sample(pid: int, root: int) -> ProcessSample | None:
    """One process's figures; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # after the command's name
        state, ppid = fields[0], int(fields[1])
        threads, start_ticks, rss_pages = int(fields[17]), int(fields[19]), int(fields[21])
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except PermissionError:
            fds = None
        if state == "Z":
            fds = None
        cmdline = _cmdline(pid) if state != "Z" else ""
        parent = _cmdline(ppid) if ppid > 1 else ""
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return ProcessSample(pid, ppid, _role(pid, root, cmdline, parent), state,
                         rss_pages * PAGE_KIB, fds, threads, start_ticks)


def sample_tree(root: int) -> dict[int, ProcessSample]:
    """The root and every process below it, by pid."""
    samples = {}
    for pid in [root, *descendants(root)]:
        found = sample(pid, root)
        if found is not None:
            samples[pid] = found
    return samples


def worker_pids(tree: dict[int, ProcessSample]) -> list[int]:
    """The workers alive, oldest first (the executor starts them in rank order)."""
    workers = [s for s in tree.values() if s.role == "worker" and s.state != "Z"]
    return [s.pid for s in sorted(workers, key=lambda s: (s.start_ticks, s.pid))]
