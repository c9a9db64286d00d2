"""What became of one request of the soak, read from the server's answer alone.

Acceptable: `completed` (a valid answer: every choice finished, a stream ended by [DONE]
without an error event), `error` (a clear failure of a valid request: a JSON 5xx in
OpenAI's shape, or a stream's error event followed by [DONE]), `refused` (bad input answered
4xx with an error object) and `cancelled` (the client went away on purpose). Everything else
is a failure of the server."""
import json
from dataclasses import asdict, dataclass

OK = ("completed", "error", "refused", "cancelled")
FAILURES = {
    "hung": "no answer within the request deadline",
    "lost": "the connection dropped, or a stream ended without [DONE]",
    "unclear": "an error without OpenAI's error object, or a 5xx for bad input",
    "refused_valid": "a valid request answered 4xx",
    "accepted_bad": "bad input answered 2xx",
    "invalid": "a 200 whose body is not a complete answer (choices, finish reasons, schema)",
}


@dataclass
class Outcome:
    kind: str
    status: str
    http_status: int | None = None
    detail: str = ""
    seconds: float = 0.0
    started: float = 0.0  # seconds since the soak began

    @property
    def failed(self) -> bool:
        return self.status not in OK

    def as_dict(self) -> dict:
        return asdict(self)


def error_object(text: str) -> dict | None:
    """OpenAI's {"error": {"message": ..., "type": ...}} from a body, or None."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error:
        return error
    return None


def judge_failure(http_status: int, text: str, bad_input: bool) -> tuple[str, str]:
    """(status, detail) of a non-2xx answer."""
    error = error_object(text)
    if error is None:
        return "unclear", f"{http_status} without an error object: {text[:120]!r}"
    detail = f"{http_status} {error.get('code') or error['type']}: {error['message'][:120]}"
    if bad_input:
        return ("refused", detail) if 400 <= http_status < 500 else ("unclear", detail)
    if 400 <= http_status < 500 and http_status != 429:
        return "refused_valid", detail
    return "error", detail


def judge_body(body: dict, n: int, check_text=None) -> tuple[str, str]:
    """(status, detail) of a non-streamed 200: n choices, each finished."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        return "invalid", f"expected {n} choices, got {choices!r:.120}"
    for choice in choices:
        if choice.get("finish_reason") not in ("stop", "length", "tool_calls"):
            return "invalid", f"choice {choice.get('index')} finish_reason " \
                              f"{choice.get('finish_reason')!r}"
        text = choice.get("text")
        if text is None:
            text = (choice.get("message") or {}).get("content")
        problem = check_text(text, choice["finish_reason"]) if check_text else None
        if problem:
            return "invalid", problem
    return "completed", ""


class StreamReader:
    """Collects a stream's events: choices' texts and finish reasons, an error, [DONE]."""

    def __init__(self):
        self.done = False
        self.error: dict | None = None
        self.texts: dict[int, str] = {}
        self.finish: dict[int, str | None] = {}
        self.events = 0
        self.bad_event: str | None = None

    def feed(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        data = line[len("data: "):]
        if data == "[DONE]":
            self.done = True
            return
        self.events += 1
        try:
            event = json.loads(data)
        except ValueError:
            self.bad_event = data[:120]
            return
        if "error" in event:
            self.error = event["error"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content")
            self.texts[index] = self.texts.get(index, "") + (piece or "")
            if choice.get("finish_reason"):
                self.finish[index] = choice["finish_reason"]

    def judge(self, n: int, check_text=None) -> tuple[str, str]:
        if not self.done:
            return "lost", f"stream ended without [DONE] after {self.events} events"
        if self.bad_event is not None:
            return "invalid", f"an event that is not JSON: {self.bad_event!r}"
        if self.error is not None:
            if not isinstance(self.error, dict) or "message" not in self.error:
                return "unclear", f"error event without a message: {self.error!r:.120}"
            return "error", f"{self.error.get('code')}: {str(self.error['message'])[:120]}"
        if sorted(self.finish) != list(range(n)):
            return "invalid", f"finish reasons for choices {sorted(self.finish)}, expected {n}"
        for index in range(n):
            problem = check_text(self.texts.get(index, ""), self.finish[index]) \
                if check_text else None
            if problem:
                return "invalid", problem
        return "completed", ""
