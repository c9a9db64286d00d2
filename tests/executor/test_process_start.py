"""Worker starts through the fork server (executor/process_start.py): a child runs under the
parent's environment and standard streams as a spawned one would, a changed PARASHIFT_
setting falls back to spawn, and on a GPU host a forked child can use the device."""
import os

import pytest
import torch

from parashift.executor import process_start


def _report(conn, name: str) -> None:
    print(f"child says {os.environ.get(name)}", flush=True)
    conn.send((os.environ.get(name), os.getpid()))
    conn.close()


def _cuda_sum(conn) -> None:
    conn.send(float(torch.arange(8, device="cuda", dtype=torch.float32).sum()))
    conn.close()


def _run(ctx, target, *args):
    parent, child = ctx.Pipe()
    proc = process_start.worker_process(ctx, target, (child, *args), name="test-worker")
    proc.start()
    child.close()
    answer = parent.recv()
    proc.join(30)
    assert proc.exitcode == 0
    return answer


def test_a_forked_worker_has_the_parents_environment_and_output(monkeypatch, capfd):
    ctx = process_start.worker_context()
    assert ctx.get_start_method() == "forkserver"
    monkeypatch.setenv("TEST_WORKER_SETTING", "set after the server started")
    value, pid = _run(ctx, _report, "TEST_WORKER_SETTING")
    assert value == "set after the server started" and pid != os.getpid()
    assert "child says set after the server started" in capfd.readouterr().out


def test_a_changed_parashift_setting_starts_a_spawned_worker(monkeypatch):
    monkeypatch.setenv("PARASHIFT_TEST_ONLY_SETTING", "1")
    ctx = process_start.worker_context()
    assert ctx.get_start_method() == "spawn"
    value, _ = _run(ctx, _report, "PARASHIFT_TEST_ONLY_SETTING")
    assert value == "1"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_forked_worker_uses_the_gpu_after_the_parent_did():
    torch.ones(1, device="cuda").sum().item()  # the parent holds a CUDA context first
    assert _run(process_start.worker_context(), _cuda_sum) == 28.0
