"""Streams each test phase's seconds and worker to a file as the reports arrive."""
import os, time

OUT = os.environ.get("C3TIMING_OUT", "/tmp/c3/full/timing.tsv")


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller writes
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "-") if node else "-"
    with open(OUT, "a") as f:
        f.write(f"{time.time():.1f}\t{worker}\t{report.when}\t{report.outcome}\t"
                f"{report.duration:.2f}\t{report.nodeid}\n")
