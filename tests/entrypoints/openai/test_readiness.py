"""Liveness, readiness and drain, as a balancer or a Kubernetes probe reads them."""
import signal
from types import SimpleNamespace

import httpx

from parashift.entrypoints.openai.readiness import Readiness, not_ready_reason
from tests.entrypoints.openai.server_utils import running_server, wait_until


def test_health_and_ready_report_the_load(engine):
    with running_server(engine) as server:
        health = httpx.get(f"{server.base_url}/health")
        ready = httpx.get(f"{server.base_url}/ready")
    assert health.status_code == 200 and health.json() == {
        "status": "ok", "load": {"requests": 0, "waiting": 0}}
    assert ready.status_code == 200 and ready.json() == {
        "status": "ready", "load": {"requests": 0, "waiting": 0}}


def test_sigterm_drains_ready_first_then_stops(engine):
    """During --drain-delay: /ready 503 "draining", /health 200, requests still served;
    then the server shuts down as without a delay."""
    with running_server(engine, drain_delay=3.0) as server:
        url = server.base_url
        server.signal(signal.SIGTERM)
        ready = httpx.get(f"{url}/ready")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
        assert httpx.get(f"{url}/health").status_code == 200
        served = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert served.status_code == 200
        assert wait_until(lambda: not server.running, timeout=30)


def test_ready_is_503_when_overloaded_or_dead():
    readiness = Readiness()
    engine = SimpleNamespace(is_running=True, dead_error=None, max_num_queued_requests=2,
                             num_waiting=1)
    assert not_ready_reason(engine, readiness) is None
    engine.num_waiting = 2
    assert not_ready_reason(engine, readiness)[0] == "overloaded"
    engine.is_running, engine.dead_error = False, RuntimeError("worker rank 1 died")
    assert not_ready_reason(engine, readiness) == ("engine_dead", "worker rank 1 died")
