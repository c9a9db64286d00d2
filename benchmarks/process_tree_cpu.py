"""CPU seconds of a command and every process it starts, daemons included (Linux). Ray's
raylet ignores SIGCHLD, so its actors' CPU never reaches any parent's rusage: this samples
/proc every 0.2 s instead and sums each process's last sample (CPU in a process's last
0.2 s, and processes shorter than that, go uncounted). It also becomes their subreaper, so
processes whose parents exit stay in the tree, as zombies until the command has ended. Usage:
python benchmarks/process_tree_cpu.py COMMAND...  (prints the sum to stderr)."""
import ctypes
import os
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
TICKS = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[int, int, float]]:
    """pid: (parent pid, start time, CPU seconds) of every process readable now."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), int(fields[19]),
                                (int(fields[11]) + int(fields[12])) / TICKS)
    return table


def descendants(table, root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.add(child)
            todo.append(child)
    return found


def main(command: list[str]) -> int:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    child = subprocess.Popen(command)
    last: dict[tuple[int, int], float] = {}  # (pid, start time): its CPU seconds last seen
    while True:
        table = processes()
        for pid in descendants(table, os.getpid()):
            last[(pid, table[pid][1])] = table[pid][2]
        if child.poll() is not None:  # then reap the orphans (zombies keep their CPU)
            if not descendants(table, os.getpid()):
                break
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
        time.sleep(0.2)
    print(f"process tree CPU: {sum(last.values()):.1f} s in {len(last)} processes",
          file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
