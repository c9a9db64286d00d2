"""Worker processes and the server's life: a `parashift serve` child drains on SIGTERM, a
lost or stopped worker rank turns /health 503 or stops the server within seconds, a
replica's killed worker leaves no zombie (the request lifecycle inside the server's
process: test_request_lifecycle.py)."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import httpx

from parashift.entrypoints.openai.launcher import free_port
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import metric_value, running_server, wait_until
from tests.entrypoints.openai.test_request_lifecycle import sse_payloads


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    def healthy():
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read()}")
        try:
            return httpx.get(f"{base_url}/health").status_code == 200
        except httpx.HTTPError:
            return False
    assert wait_until(healthy, timeout=timeout, interval=0.2)


@contextlib.contextmanager
def cli_server(tmp_path, *flags):
    """`parashift serve` on a tiny random model as a subprocess, once healthy: (the
    process, its base URL); killed on leaving if still running."""
    model_dir = save_tiny_llama(tmp_path / "tiny")
    port = free_port()
    command = [sys.executable, "-m", "parashift.entrypoints.openai", "serve", model_dir,
               "--device", "cpu", "--dtype", "float32", "--skip-tokenizer-init",
               "--num-blocks", "64", "--port", str(port), *flags]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_healthy(base_url, proc)
        yield proc, base_url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_drains_then_exits(tmp_path):
    """The CLI server on a tiny random model: SIGTERM lets the stream finish."""
    with cli_server(tmp_path, "--shutdown-timeout", "30") as (proc, base_url):
        request = {"prompt": [1, 2, 3], "max_tokens": 450, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{base_url}/v1/completions", json=request) as response:
            payloads = sse_payloads(response.iter_lines())
            next(payloads)
            proc.send_signal(signal.SIGTERM)
            rest = list(payloads)
        assert rest[-1]["usage"]["completion_tokens"] == 450
        assert proc.wait(timeout=60) == 0  # a clean drain: 0, as a supervisor expects
        assert "Waiting for connections to close" in proc.stderr.read()


@contextlib.contextmanager
def tp2_server(model_dir, **engine_options):
    """A server around a fresh 2-rank (tensor parallel) engine on a tiny model."""
    from parashift.config import EngineConfig
    from parashift.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=model_dir, device="cpu", dtype="float32",
                                    skip_tokenizer_init=True, num_blocks=64,
                                    tensor_parallel_size=2, **engine_options))
    try:
        with running_server(engine) as server:
            yield server, engine.executor.procs
    finally:
        engine.shutdown()


def test_a_worker_killed_while_idle_turns_health_503_within_seconds(tmp_path):
    """No request flows; it used to stay 200 until the next request got a BrokenPipe 500."""
    with tp2_server(save_tiny_llama(tmp_path / "tiny")) as (server, procs):
        url = server.base_url
        assert httpx.get(f"{url}/health").status_code == 200
        os.kill(procs[1].pid, signal.SIGKILL)
        started = time.monotonic()
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 503, timeout=5)
        assert time.monotonic() - started < 5
        health = httpx.get(f"{url}/health").json()["error"]
        assert health["code"] == "engine_dead" and "rank 1" in health["message"]
        assert "SIGKILL" in health["message"]
        assert metric_value(url, "parashift_engine_alive") == 0
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert refused.status_code == 500 and "rank 1" in refused.json()["error"]["message"]


def test_a_stream_fails_within_seconds_when_its_worker_stops(tmp_path):
    """A SIGSTOPped rank: the stream ends with an error event naming it (and [DONE]) after
    the heartbeat timeout, not after the 600 s step timeout; /health turns 503."""
    model_dir = save_tiny_llama(tmp_path / "tiny")
    with tp2_server(model_dir, worker_heartbeat_timeout_s=2) as (server, procs):
        request = {"prompt": [1, 2, 3], "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=request,
                          timeout=60) as response:
            lines = response.iter_lines()
            next(sse_payloads(lines))
            os.kill(procs[0].pid, signal.SIGSTOP)
            started = time.monotonic()
            try:
                events = [line for line in lines if line.startswith("data: ")]
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(procs[0].pid, signal.SIGCONT)
        assert time.monotonic() - started < 6
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: "):])["error"]
        assert error["code"] == "engine_dead" and "rank 0" in error["message"]
        assert "no heartbeat" in error["message"]
        assert httpx.get(f"{server.base_url}/health").status_code == 503


def worker_pids(server: subprocess.Popen) -> list[int]:
    """The server's worker processes in the order they started, read from Linux's /proc:
    children of its multiprocessing fork server (executor/process_start.py), or spawned
    ones; not multiprocessing's resource tracker."""
    from pathlib import Path

    def children(pid: int) -> list[int]:
        return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]

    def cmdline(pid: int) -> bytes:
        return Path(f"/proc/{pid}/cmdline").read_bytes()

    direct = children(server.pid)
    forked = [pid for server_pid in direct if b"forkserver" in cmdline(server_pid)
              for pid in children(server_pid)]
    return sorted(forked + [pid for pid in direct if b"spawn_main" in cmdline(pid)])


def test_serve_exits_non_zero_when_a_worker_dies(tmp_path):
    """`parashift serve -tp 2`: a worker SIGKILLed while idle stops the server within
    seconds, with exit code 1 and a line naming the rank, so a supervisor restarts it
    (it used to answer /health 200 and serve on)."""
    with cli_server(tmp_path, "-tp", "2") as (proc, base_url):
        workers = worker_pids(proc)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        started = time.monotonic()

        def not_healthy():
            try:
                return httpx.get(f"{base_url}/health").status_code == 503
            except httpx.HTTPError:
                return True  # the server is already gone
        assert wait_until(not_healthy, timeout=5, interval=0.05)
        assert proc.wait(timeout=30) == 1
        assert time.monotonic() - started < 15
        log = proc.stderr.read()
        assert "exiting: the engine failed: worker rank 1 died (killed by SIGKILL)" in log


def process_state(pid: int) -> str | None:
    """Linux's state letter of a process (Z: a zombie), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_worker_the_engine_kills_is_reaped_while_the_server_serves_on(tmp_path):
    """`parashift serve -dp 2`: a worker stopped (SIGSTOP) is killed by the engine, which
    serves on with the other replica; the killed process leaves no zombie behind."""
    with cli_server(tmp_path, "-dp", "2", "--worker-heartbeat-timeout-s", "2") as (proc,
                                                                                   base_url):
        stopped, serving = worker_pids(proc)
        os.kill(stopped, signal.SIGSTOP)
        assert wait_until(lambda: httpx.get(f"{base_url}/health").json().get("status")
                          == "degraded", timeout=15, interval=0.2)
        assert wait_until(lambda: process_state(stopped) is None, timeout=5)
        assert process_state(serving) not in (None, "Z")
        reply = httpx.post(f"{base_url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert reply.status_code == 200
