"""Sends one request of the soak and judges what came back (outcomes.py)."""
import asyncio
import time

import httpx

from parashift.bench.soak.outcomes import Outcome, StreamReader, judge_body, judge_failure
from parashift.bench.soak.requests import Spec, check_person

EVENTS_BEFORE_CLOSE = 2


async def _read(client: httpx.AsyncClient, spec: Spec) -> tuple[str, int | None, str]:
    check = check_person if spec.structured else None
    kwargs = {"content": spec.raw, "headers": {"content-type": "application/json"}} \
        if spec.raw is not None else {"json": spec.body}
    async with client.stream("POST", spec.path, **kwargs) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            status, detail = judge_failure(response.status_code, text, spec.bad_input)
            return status, response.status_code, detail
        if spec.bad_input:
            await response.aread()
            return "accepted_bad", 200, f"body {spec.body or spec.raw!r:.120}"
        if not spec.stream:
            body = await response.aread()
            try:
                parsed = httpx.Response(200, content=body).json()
            except ValueError:
                return "invalid", 200, f"a 200 that is not JSON: {body[:120]!r}"
            status, detail = judge_body(parsed, spec.n, check)
            return status, 200, detail
        reader = StreamReader()
        async for line in response.aiter_lines():
            reader.feed(line)
            if spec.action == "close_stream" and reader.events >= EVENTS_BEFORE_CLOSE:
                return "cancelled", 200, f"closed after {reader.events} events"
        status, detail = reader.judge(spec.n, check)
        if spec.action == "close_stream" and status == "completed":
            detail = "finished before the client closed it"
        return status, 200, detail


async def perform(client: httpx.AsyncClient, spec: Spec, deadline_s: float,
                  t0: float) -> Outcome:
    """Runs `spec` against the client's server; never raises."""
    started = time.monotonic()
    outcome = Outcome(spec.kind, "lost", started=round(started - t0, 3))
    try:
        if spec.action == "leave":
            try:
                await asyncio.wait_for(_read(client, spec), spec.leave_after_s)
                outcome.status, outcome.detail = "cancelled", "answered before the client left"
            except asyncio.TimeoutError:
                outcome.status = "cancelled"
                outcome.detail = f"left after {spec.leave_after_s:.2f} s"
        else:
            status, code, detail = await asyncio.wait_for(_read(client, spec), deadline_s)
            outcome.status, outcome.http_status, outcome.detail = status, code, detail
    except asyncio.TimeoutError:
        outcome.status, outcome.detail = "hung", f"no answer in {deadline_s:.0f} s"
    except httpx.HTTPError as exc:
        outcome.status, outcome.detail = "lost", f"{type(exc).__name__}: {exc}"[:200]
    outcome.seconds = round(time.monotonic() - started, 3)
    return outcome
