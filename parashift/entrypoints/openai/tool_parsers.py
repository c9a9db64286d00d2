"""Tool calls in a model's text, by the format its chat template teaches it, selected as
vLLM's `--tool-call-parser`: `hermes` (<tool_call>{"name": ..., "arguments": ...}
</tool_call>, Hermes and Qwen2.5) and `llama3_json` (a JSON object {"name": ...,
"parameters": ...} as the whole reply, several separated by ';')."""
import json
import re
from dataclasses import dataclass, field


@dataclass
class FunctionCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ParsedReply:
    content: str | None
    calls: list[FunctionCall] = field(default_factory=list)


def _call(obj, arguments_key: str) -> FunctionCall | None:
    """A call from its decoded JSON, None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return FunctionCall(name=obj["name"], arguments=text)


def _held_back(text: str, marker: str) -> int:
    """Length of text that may be shown before `marker`: up to it, or up to a suffix of
    text that could be its beginning."""
    found = text.find(marker)
    if found >= 0:
        return found
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedReply:
        if self.START not in text:
            return ParsedReply(text)
        calls = []
        for body in self._BLOCK.findall(text):
            try:
                call = _call(json.loads(body), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                return ParsedReply(text)  # not a well-formed call: the text as it is
            calls.append(call)
        content = text[:text.find(self.START)].strip()
        return ParsedReply(content or None, calls)

    def streamable(self, text: str) -> int:
        return _held_back(text, self.START)


class Llama3JsonParser:
    PYTHON_TAG = "<|python_tag|>"

    def parse(self, text: str) -> ParsedReply:
        body = text.strip().removeprefix(self.PYTHON_TAG).strip()
        if not body.startswith("{"):
            return ParsedReply(text)
        calls, decoder, at = [], json.JSONDecoder(), 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return ParsedReply(text)
            call = _call(obj, "parameters")
            if call is None:
                return ParsedReply(text)
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        return ParsedReply(None, calls)

    def streamable(self, text: str) -> int:
        """A reply is a call when it starts with '{' (or the python tag): shown only once
        it cannot be."""
        body = text.lstrip()
        if not body or body.startswith("{") or body.startswith(self.PYTHON_TAG) or \
                self.PYTHON_TAG.startswith(body):
            return 0
        return len(text)


TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}
