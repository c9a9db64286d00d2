"""The tool call parsers on replies in each format, as the models' chat templates teach
them (Qwen2.5 / Hermes 2 Pro: <tool_call> blocks; Llama 3.1/3.2: a bare JSON object)."""
import json

import pytest

from parashift.entrypoints.openai.tool_parsers import (FunctionCall, HermesParser,
                                                       Llama3JsonParser, TOOL_PARSERS)

QWEN_ONE = ('<tool_call>\n{"name": "get_current_temperature", "arguments": '
            '{"location": "San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>')
QWEN_TWO = ('I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
            '{"zone": "CET"}}\n</tool_call>')
HERMES_CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
LLAMA_ONE = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
LLAMA_TAGGED = '<|python_tag|>{"name": "search", "parameters": {"query": "ünïcode"}}'
LLAMA_TWO = ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
             '{"name": "get_time", "parameters": {"zone": "CET"}}')


def args(call: FunctionCall) -> dict:
    return json.loads(call.arguments)


def test_hermes_one_call():
    reply = HermesParser().parse(QWEN_ONE)
    assert reply.content is None
    (call,) = reply.calls
    assert call.name == "get_current_temperature"
    assert args(call) == {"location": "San Francisco, CA, USA", "unit": "celsius"}


def test_hermes_two_calls_after_text():
    reply = HermesParser().parse(QWEN_TWO)
    assert reply.content == "I will look both up."
    assert [(c.name, args(c)) for c in reply.calls] == [("get_weather", {"city": "Paris"}),
                                                        ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize("text", ["The weather in Paris is sunny.", HERMES_CUT,
                                  "<tool_call>\n[1, 2]\n</tool_call>"])
def test_hermes_without_a_whole_call_is_content(text):
    reply = HermesParser().parse(text)
    assert reply.content == text and reply.calls == []


def test_hermes_streams_up_to_the_tag():
    parser = HermesParser()
    assert parser.streamable("Sure. <tool") == len("Sure. ")
    assert parser.streamable("Sure. <tool_call>{") == len("Sure. ")
    assert parser.streamable("a < b") == len("a < b")
    assert parser.streamable("plain") == 5


@pytest.mark.parametrize("text, calls", [
    (LLAMA_ONE, [("get_weather", {"city": "Paris", "days": 2})]),
    (LLAMA_TAGGED, [("search", {"query": "ünïcode"})]),
    (LLAMA_TWO, [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    ('  {"name": "f", "arguments": {"x": 1}}\n', [("f", {"x": 1})]),
])
def test_llama3_json_calls(text, calls):
    reply = Llama3JsonParser().parse(text)
    assert reply.content is None
    assert [(c.name, args(c)) for c in reply.calls] == calls


@pytest.mark.parametrize("text", ["Paris is sunny.", '{"name": "get_weather", "param',
                                  '{"city": "Paris"}', 'Call: {"name": "f", "parameters": {}}'])
def test_llama3_json_other_replies_are_content(text):
    reply = Llama3JsonParser().parse(text)
    assert reply.content == text and reply.calls == []


def test_llama3_json_holds_back_what_may_be_a_call():
    parser = Llama3JsonParser()
    assert parser.streamable("") == 0
    assert parser.streamable("  {") == 0
    assert parser.streamable("<|python") == 0
    assert parser.streamable("Paris") == 5


def test_registry_has_vllms_names():
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json"}


def chat_server(parser: str):
    from types import SimpleNamespace

    from parashift.entrypoints.openai.serving_chat import ChatServer
    return ChatServer(SimpleNamespace(tool_call_parser=parser, enable_auto_tool_choice=True))


def auto_request():
    from parashift.entrypoints.openai.protocol import ChatCompletionRequest
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}]})


def test_auto_reply_with_calls_finishes_with_tool_calls():
    content, calls, finish = chat_server("hermes").reply(auto_request(), QWEN_TWO, "stop")
    assert content == "I will look both up." and finish == "tool_calls"
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert all(c.id.startswith("chatcmpl-tool-") and c.type == "function" for c in calls)
    assert chat_server("hermes").reply(auto_request(), "Sunny.", "stop") == ("Sunny.", [], "stop")


def test_auto_stream_shows_the_text_before_the_call_and_all_of_a_plain_reply():
    from types import SimpleNamespace
    server, request = chat_server("llama3_json"), auto_request()
    partial = SimpleNamespace(text='{"name": "get_wea', finish_reason=None)
    done = SimpleNamespace(text=LLAMA_ONE, finish_reason="stop")
    plain = SimpleNamespace(text="Paris is sunny.", finish_reason="stop")
    assert server.shown(request, partial, False) == ""
    assert server.shown(request, done, True) == ""
    assert server.shown(request, plain, True) == "Paris is sunny."
