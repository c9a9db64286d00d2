"""Request lifecycle: disconnects free KV blocks, shutdown drains, a dead engine
fails pending requests and turns /health to 503."""
import json
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


def test_shutdown_timeout_cuts_long_requests(engine):
    with running_server(engine, shutdown_timeout=0.5) as server:
        with httpx.stream("POST", f"{server.base_url}/v1/completions",
                          json={**LONG, "stream": True}) as response:
            payloads = sse_payloads(response.iter_lines())
            next(payloads)
            started = time.monotonic()
            server.stop()
            assert time.monotonic() - started < 15
            with pytest.raises(httpx.HTTPError):
                list(payloads)
    assert not engine.has_unfinished_requests()


class FailingEngine:
    """The shared engine, except that `step()` raises once `fail` is set."""

    def __init__(self, inner):
        self._inner = inner
        self.fail = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        if self.fail.is_set():
            raise RuntimeError("simulated failure in /very/secret/path.py")
        return self._inner.step()


def test_dead_engine_fails_pending_requests_and_health(engine):
    failing = FailingEngine(engine)
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
            failing.fail.set()
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


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    def healthy():
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read()}")
        try:
            return httpx.get(f"{base_url}/health").status_code == 200
        except httpx.HTTPError:
            return False
    assert wait_until(healthy, timeout=timeout, interval=0.2)


def test_sigterm_drains_then_exits(tmp_path):
    """The CLI server on a tiny random model: SIGTERM lets the stream finish."""
    model_dir = save_tiny_llama(tmp_path / "tiny")
    port = free_port()
    command = [sys.executable, "-m", "parashift.entrypoints.openai", "serve", model_dir,
               "--device", "cpu", "--dtype", "float32", "--skip-tokenizer-init",
               "--num-blocks", "64", "--port", str(port), "--shutdown-timeout", "30"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_healthy(base_url, proc)
        request = {"prompt": [1, 2, 3], "max_tokens": 450, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{base_url}/v1/completions", json=request) as response:
            payloads = sse_payloads(response.iter_lines())
            next(payloads)
            proc.send_signal(signal.SIGTERM)
            rest = list(payloads)
        assert rest[-1]["usage"]["completion_tokens"] == 450
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Waiting for connections to close" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
