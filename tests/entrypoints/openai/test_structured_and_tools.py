"""Structured output and tool calling over HTTP, with the openai client where it has the
fields, on the embedded SmolLM2."""
import json

import httpx
import jsonschema
import pytest

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def chat(http, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"messages": ASK_WEATHER, **body})


def test_response_format_json_schema(client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "A person as JSON"}],
            response_format=fmt, temperature=1.0, seed=seed, max_tokens=40)
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
        assert reply.choices[0].finish_reason == "stop"


def test_response_format_streamed(client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "A person as JSON"}],
        response_format=fmt, temperature=0, max_tokens=40, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("body, check", [
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"regex": "[a-c]{4}"}},
     lambda t: len(t) == 4 and set(t) <= set("abc")),
    ({"guided_regex": "[a-c]{4}"}, lambda t: len(t) == 4 and set(t) <= set("abc")),
    ({"structured_outputs": {"json": PERSON}},
     lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    ({"guided_grammar": 'root ::= "A" | "B"'}, lambda t: t in ("A", "B")),
])
def test_vllm_fields_on_completions(http, body, check):
    response = http.post("/v1/completions", json={"prompt": "Is it? Answer:", "max_tokens": 40,
                                                  "temperature": 1.0, **body})
    assert response.status_code == 200, response.text
    assert check(response.json()["choices"][0]["text"])


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "response_format", "objectx"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs", "regex"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "nope"}}}},
     "guided_json", "nope"),
    ({"structured_outputs": {"choice": []}}, None, "choice"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern",
     "whitespace"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, None, "at most one"),
    ({"response_format": {"type": "json_schema"}}, None, "json_schema"),
    ({"tool_choice": "required"}, None, "tool_choice needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     None, "nope"),
    ({"tools": [WEATHER]}, "tool_choice", "--enable-auto-tool-choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "tool_choice",
     "guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}],
      "tool_choice": "required"}, "tools", "nope"),
])
def test_bad_constraints_are_400s(http, body, param, words):
    response = chat(http, max_tokens=4, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param
    assert chat(http, max_tokens=2).status_code == 200  # the engine serves on


def test_named_tool_choice_forces_a_valid_call(client, model_name):
    reply = client.chat.completions.create(
        model=model_name, messages=ASK_WEATHER, tools=[WEATHER, TIME], temperature=1.0, seed=3,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40)
    message = reply.choices[0].message
    (call,) = message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert message.content is None and reply.choices[0].finish_reason == "stop"


def test_required_tool_choice_calls_one_of_the_tools(client, model_name):
    reply = client.chat.completions.create(
        model=model_name, messages=ASK_WEATHER, tools=[WEATHER, TIME], tool_choice="required",
        temperature=0, max_tokens=80)
    calls = reply.choices[0].message.tool_calls
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])


def test_streamed_named_call_comes_in_one_delta(client, model_name):
    chunks = list(client.chat.completions.create(
        model=model_name, messages=ASK_WEATHER, tools=[WEATHER], temperature=0, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert content == ""
    (call,) = deltas
    assert call.index == 0 and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_tool_history_reaches_the_template(http):
    """An assistant turn with tool_calls and the tool's answer render and run."""
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call-1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny, 21 C"}]
    response = http.post("/v1/chat/completions", json={
        "messages": messages, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["tool_calls"] == []
