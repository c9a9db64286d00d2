"""Server-sent events as clients split them: every event on one line."""
import json

from pydantic import BaseModel

from parashift.entrypoints.openai.serving_base import sse_event


class Text(BaseModel):
    text: str


def test_an_event_stays_on_one_line_for_a_splitlines_client():
    """Generated text may hold U+0085, U+2028 or U+2029, which JSON leaves raw and
    str.splitlines (httpx's aiter_lines) breaks at: the soak saw an event cut there."""
    text = "a\x85b\u2028c\u2029d\x0b\x1ce \u00e9 \U0001f600"
    event = sse_event(Text(text=text)) + sse_event({"text": text})
    lines = [line for line in event.splitlines() if line]  # as httpx's line decoder splits
    assert len(lines) == 2 and all(line.startswith("data: ") for line in lines)
    assert [json.loads(line[len("data: "):])["text"] for line in lines] == [text, text]
    assert "\u00e9" in lines[0]  # other characters stay as they are
