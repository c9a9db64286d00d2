"""The soak's /proc reader on a real process tree: a child that leaves a zombie."""
import subprocess
import sys
import time

from parashift.bench.soak.leaks import zombies
from parashift.bench.soak.processes import descendants, sample, sample_tree

# a parent that starts a child and reaps it only once told to (a line on its stdin)
PARENT = ("import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', 'pass']); "
          "print('started', flush=True); sys.stdin.readline(); os.wait()")


def test_the_tree_shows_a_zombie_child():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while not zombies(sample_tree(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = sample_tree(parent.pid)
        (child,) = descendants(parent.pid)
        assert zombies(tree) == [child]
        front = tree[parent.pid]
        assert front.role == "front" and front.state in "RS" and front.rss_kib > 1000
        assert front.fds >= 3 and front.threads >= 1
        parent.stdin.write("reap\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert sample(parent.pid, parent.pid) is None and sample(child, parent.pid) is None
