"""Drives one phase of a workload against a server: requests leave at their
arrival times (at most `max_concurrency` in flight), /metrics is sampled."""
import asyncio
import time
from dataclasses import dataclass

import httpx

from parashift.bench.client import Endpoint, RequestRecord, send_request
from parashift.bench.server_metrics import MetricsPoller, ServerSample
from parashift.bench.workloads import BenchRequest, Phase


@dataclass
class PhaseResult:
    phase: Phase
    records: list[RequestRecord]
    duration_s: float
    server_samples: list[ServerSample]
    max_concurrency: int | None


def new_client(api_key: str | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits,
                             headers=headers)


class ServerUnavailableError(RuntimeError):
    """No server answers at the base URL, or it refuses to list its models."""


async def discover_model(base_url: str, api_key: str | None) -> str:
    """The first model the server lists at /v1/models."""
    url = base_url.rstrip("/") + "/v1/models"
    async with new_client(api_key) as client:
        try:
            response = await client.get(url)
        except httpx.TransportError as e:
            raise ServerUnavailableError(f"no server answers at {base_url} ({type(e).__name__}"
                                         f"{': ' + str(e) if str(e) else ''}); start one with "
                                         "`parashift serve` or pass --base-url") from None
        if response.status_code != 200:
            raise ServerUnavailableError(f"{url} answered HTTP {response.status_code}: "
                                         f"{response.text[:200]}")
        models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url} lists no models; pass --model")
    return models[0]["id"]


async def warm_up(endpoint: Endpoint, requests: list[BenchRequest], count: int) -> None:
    """`count` short requests, one at a time, before anything is measured."""
    if count <= 0 or not requests:
        return
    async with new_client() as client:
        for i in range(count):
            base = requests[i % len(requests)]
            short = BenchRequest(-1 - i, base.input_len, min(base.output_len, 4), 0.0,
                                 base.ignore_eos, base.prompt)
            await send_request(client, endpoint, short, time.perf_counter())


async def run_phase(phase: Phase, endpoint: Endpoint, max_concurrency: int | None = None,
                    metrics_interval_s: float = 0.5) -> PhaseResult:
    concurrency = phase.max_concurrency or max_concurrency
    if phase.max_concurrency and max_concurrency:
        concurrency = min(phase.max_concurrency, max_concurrency)
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    async with new_client() as client:
        t0 = time.perf_counter()
        poller = MetricsPoller(client, endpoint.base_url, t0, metrics_interval_s)
        polling = asyncio.create_task(poller.run())
        records = await asyncio.gather(*(
            _at_arrival(client, endpoint, request, t0, gate) for request in phase.requests))
        duration = time.perf_counter() - t0
        poller.stop()
        await polling
    return PhaseResult(phase, list(records), duration, poller.samples, concurrency)


async def _at_arrival(client, endpoint, request: BenchRequest, t0: float, gate):
    delay = t0 + request.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if gate is None:
        return await send_request(client, endpoint, request, t0)
    async with gate:
        return await send_request(client, endpoint, request, t0)
