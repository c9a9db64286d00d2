"""Tools and the chat template: a warning, once, when the template leaves a request's
tools out (the embedded SmolLM2's does); /tokenize renders messages with `tools` as a
chat request does."""
import contextlib
import logging

import httpx
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RENDERS_TOOLS = ("{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
                 "{{ '\\n' }}{% endif %}"
                 "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
WARNING = "the chat template does not render `tools`"


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@contextlib.contextmanager
def warnings_logged():
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("parashift")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def tokenize(http, **body) -> list[int]:
    reply = http.post("/tokenize", json={"messages": ASK, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def test_a_template_that_ignores_tools_is_warned_about_once(http):
    with warnings_logged() as records:
        for _ in range(2):
            reply = http.post("/v1/chat/completions", json={
                "messages": ASK, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 2})
            assert reply.status_code == 200
    assert sum(WARNING in record.getMessage() for record in records) == 1
    assert tokenize(http, tools=[WEATHER]) == tokenize(http)  # the template drops them


def test_tokenize_renders_the_tools_with_a_template_that_takes_them(server, http):
    ctx = server.app.state.serving
    saved = ctx.tokenizer.chat_template, ctx.template_ignores_tools
    ctx.tokenizer.chat_template, ctx.template_ignores_tools = RENDERS_TOOLS, None
    try:
        with_tools, without = tokenize(http, tools=[WEATHER]), tokenize(http)
        assert ctx.decode(with_tools).startswith("Tools: get_weather\n")
        assert with_tools[-len(without):] == without
        with warnings_logged() as records:
            http.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER],
                                                    "tool_choice": "none", "max_tokens": 1})
        assert not [r for r in records if WARNING in r.getMessage()]
        assert ctx.template_ignores_tools is False
    finally:
        ctx.tokenizer.chat_template, ctx.template_ignores_tools = saved


def test_tokenize_refuses_tools_with_a_prompt(http):
    reply = http.post("/tokenize", json={"prompt": "hi", "tools": [WEATHER]})
    assert reply.status_code == 400 and "tools go with messages" in reply.json()["error"]["message"]
