"""Request lifecycle: disconnects free KV blocks, shutdown drains, a dead engine
fails pending requests and turns /health to 503."""
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from parashift.entrypoints.openai.launcher import free_port
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import (metric_value, running_server,
                                                   wait_engine_idle, wait_until)

LONG = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


def sse_payloads(lines):
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def blocks_in_use(server) -> int:
    stats = server.app.state.async_engine.engine.stats()
    return stats.num_total_blocks - stats.num_free_blocks


def test_stream_disconnect_frees_blocks(engine):
    with running_server(engine) as server, httpx.Client(base_url=server.base_url) as http:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
            payloads = sse_payloads(response.iter_lines())
            for _ in range(3):
                next(payloads)
            assert blocks_in_use(server) > 0
        # leaving the block closes the connection mid-stream
        assert wait_engine_idle(server, timeout=10)
        assert metric_value(server.base_url, "parashift_generation_tokens_total") < 400


def test_non_stream_disconnect_frees_blocks(engine):
    with running_server(engine) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/completions", json=LONG, timeout=1.5)
        assert wait_engine_idle(server, timeout=10)
        assert metric_value(server.base_url, "parashift_generation_tokens_total") < 400
        assert metric_value(server.base_url, "parashift_requests_aborted_total") == 1
        assert server.app.state.async_engine.num_streams == 0


def test_shutdown_drains_in_flight_requests(engine):
    request = {**LONG, "max_tokens": 24, "stream": True,
               "stream_options": {"include_usage": True}}
    with running_server(engine, shutdown_timeout=60) as server:
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=request) as response:
            payloads = sse_payloads(response.iter_lines())
            next(payloads)
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            time.sleep(0.5)
            with pytest.raises(httpx.ConnectError):  # no new connections while draining
                httpx.get(f"{server.base_url}/health")
            rest = list(payloads)
        stopper.join(30)
        assert not stopper.is_alive()
    assert rest[-1]["usage"]["completion_tokens"] == 24
    assert rest[-2]["choices"][0]["finish_reason"] == "length"


@contextlib.contextmanager
def server_log_records():
    """What uvicorn and parashift log while the block runs (enter it once the server
    runs: uvicorn's logging set-up drops handlers added before)."""
    records = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "parashift")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def assert_no_tracebacks(records) -> None:
    noisy = [r.getMessage() for r in records if r.exc_info or "Traceback" in r.getMessage()]
    assert not noisy, noisy


def check_shutdown_error(error: dict) -> None:
    assert error["code"] == "shutdown_timeout" and error["type"] == "service_unavailable_error"
    assert "0.5 s" in error["message"]


def test_shutdown_timeout_ends_every_request(engine):
    """Past --shutdown-timeout a stream ends with an error event then [DONE] (it used to be
    cut mid-body), a waiting non-streamed request gets a JSON 503 (it used to be a
    plain-text 500), and no CancelledError traceback reaches the log."""
    result = {}
    with running_server(engine, shutdown_timeout=0.5) as server, server_log_records() as records:
        waiter = threading.Thread(target=lambda: result.setdefault(
            "response", httpx.post(f"{server.base_url}/v1/completions", json=LONG, timeout=60)))
        with httpx.stream("POST", f"{server.base_url}/v1/completions",
                          json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            next(sse_payloads(lines))
            waiter.start()
            assert wait_until(lambda: server.app.state.async_engine.num_streams == 2)
            started = time.monotonic()
            server.stop()
            assert time.monotonic() - started < 15
            events = [line for line in lines if line.startswith("data: ")]
        waiter.join(30)
    assert events[-1] == "data: [DONE]"
    check_shutdown_error(json.loads(events[-2][len("data: "):])["error"])
    pending = result["response"]
    assert pending.status_code == 503
    assert pending.headers["content-type"] == "application/json"
    check_shutdown_error(pending.json()["error"])
    assert_no_tracebacks(records)
    assert not engine.has_unfinished_requests()


class ArmedEngine:
    """The shared engine, except that once `armed` is set `step()` first runs `fault()`."""

    def __init__(self, inner, fault):
        self._inner = inner
        self._fault = fault
        self.armed = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        if self.armed.is_set():
            self._fault()
        return self._inner.step()


def test_shutdown_timeout_ends_a_request_the_engine_has_not_taken(engine):
    """A request still waiting for the engine thread (busy with a long step) when the
    timeout passes gets its JSON 503 then, not after the step."""
    slow = ArmedEngine(engine, lambda: time.sleep(4))
    result = {}
    with running_server(slow, shutdown_timeout=0.5) as server:
        with httpx.stream("POST", f"{server.base_url}/v1/completions",
                          json={**LONG, "stream": True}) as response:
            next(sse_payloads(response.iter_lines()))
            slow.armed.set()
            waiter = threading.Thread(target=lambda: result.setdefault("response", httpx.post(
                f"{server.base_url}/v1/completions", json=LONG, timeout=60)))
            waiter.start()
            time.sleep(0.5)  # the request is in, waiting for the sleeping engine thread
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            waiter.join(3)
            assert not waiter.is_alive(), "the reply waited for the engine's step"
        stopper.join(30)
    pending = result["response"]
    assert pending.status_code == 503
    check_shutdown_error(pending.json()["error"])
    assert not engine.has_unfinished_requests()


def fail_step():
    raise RuntimeError("simulated failure in /very/secret/path.py")


def test_dead_engine_fails_pending_requests_and_health(engine):
    failing = ArmedEngine(engine, fail_step)
    with running_server(failing) as server, httpx.Client(base_url=server.base_url,
                                                         timeout=60) as http:
        result = {}
        waiter = threading.Thread(target=lambda: result.setdefault(
            "response", http.post("/v1/completions", json=LONG)))
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as stream:
            payloads = sse_payloads(stream.iter_lines())
            next(payloads)
            waiter.start()
            assert wait_until(lambda: server.app.state.async_engine.num_streams == 2)
            failing.armed.set()
            last = list(payloads)[-1]
        waiter.join(30)
        assert last["error"]["code"] == "engine_dead"
        pending = result["response"]
        assert pending.status_code == 500
        error = pending.json()["error"]
        assert error["code"] == "engine_dead" and "secret" not in error["message"]
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_dead"
        refused = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert refused.status_code == 500 and refused.json()["error"]["code"] == "engine_dead"
    assert not engine.has_unfinished_requests()


def test_metrics_say_when_the_engine_died(engine):
    """/metrics is not left standing at the dead engine's last numbers: engine_alive turns
    0 and the running/waiting gauges drop to 0 (their requests have all failed)."""
    failing = ArmedEngine(engine, fail_step)
    with running_server(failing) as server:
        url = server.base_url
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as s:
            payloads = sse_payloads(s.iter_lines())
            next(payloads)
            assert metric_value(url, "parashift_engine_alive") == 1
            assert metric_value(url, "parashift_num_requests_running") == 1
            failing.armed.set()
            list(payloads)
        assert httpx.get(f"{url}/health").status_code == 503
        assert metric_value(url, "parashift_engine_alive") == 0
        assert metric_value(url, "parashift_num_requests_running") == 0
        assert metric_value(url, "parashift_num_requests_waiting") == 0
    assert not engine.has_unfinished_requests()


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
