"""Request lifecycle in the server's own process: disconnects free KV blocks, shutdown
drains, a dead engine fails pending requests and turns /health to 503 (the shared
in-process engine; the worker processes' side is test_lifecycle.py)."""
import contextlib
import json
import logging
import threading
import time

import httpx
import pytest

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
