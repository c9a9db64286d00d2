"""One streaming request to any OpenAI-compatible server, timed chunk by chunk."""
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from parashift.bench.workloads import BenchRequest


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    kind: str = "completions"  # "completions" | "chat"
    api_key: str | None = None
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)
    path: str | None = None  # the API's path (vLLM's --endpoint); None: the kind's /v1 one

    def __post_init__(self):
        if self.kind not in ("completions", "chat"):
            raise ValueError(f"endpoint must be completions or chat, got {self.kind!r}")

    @property
    def url(self) -> str:
        path = self.path or ("/v1/chat/completions" if self.kind == "chat" else "/v1/completions")
        return self.base_url.rstrip("/") + path

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def payload(self, request: BenchRequest) -> dict:
        body = {"model": self.model, "max_tokens": request.output_len, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": self.temperature}
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.priority:
            body["priority"] = request.priority
        if self.kind == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        return {**body, **self.extra_body}


@dataclass
class RequestRecord:
    """Times are seconds since the start of the run."""
    index: int
    input_len: int
    output_len: int
    scheduled_s: float
    start_s: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    success: bool = False
    error: str | None = None
    priority: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def e2e(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2 or self.first_token_s is None:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def to_dict(self) -> dict:
        return {**asdict(self), "ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}


async def send_request(client: httpx.AsyncClient, endpoint: Endpoint, request: BenchRequest,
                       t0: float) -> RequestRecord:
    """Streams one request; never raises for server or network errors."""
    record = RequestRecord(request.index, request.input_len, request.output_len,
                           request.arrival_s, start_s=time.perf_counter() - t0,
                           priority=request.priority)
    try:
        async with client.stream("POST", endpoint.url, json=endpoint.payload(request),
                                 headers=endpoint.headers) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
            else:
                await _read_events(response, record, t0)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    record.end_s = time.perf_counter() - t0
    record.success = record.error is None and record.first_token_s is not None
    if not record.output_tokens:
        record.output_tokens = len(record.chunk_times)
    return record


async def _read_events(response: httpx.Response, record: RequestRecord, t0: float) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        now = time.perf_counter() - t0
        event = json.loads(data)
        if "error" in event:
            record.error = str(event["error"].get("message", event["error"]))[:300]
            return
        if event.get("usage"):
            record.prompt_tokens = event["usage"].get("prompt_tokens")
            record.output_tokens = event["usage"].get("completion_tokens") or 0
        choices = event.get("choices") or []
        if choices and not _is_role_opening(choices[0]):
            record.chunk_times.append(now)
            if record.first_token_s is None:
                record.first_token_s = now
            record.finish_reason = choices[0].get("finish_reason") or record.finish_reason


def _is_role_opening(choice: dict) -> bool:
    """The first chat chunk only says `role: assistant`; it carries no token."""
    delta = choice.get("delta")
    return delta is not None and bool(delta.get("role")) and not delta.get("content") and \
        not choice.get("finish_reason")
