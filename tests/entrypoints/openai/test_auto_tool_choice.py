"""tool_choice "auto" on a server started with --enable-auto-tool-choice (its own module:
one server at a time may wrap the shared engine)."""
import openai

from tests.entrypoints.openai.server_utils import running_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_auto_tool_choice_with_a_parser(engine):
    """The hermes parser under tool_choice "auto": SmolLM2 answers in plain text, which
    stays content (the parsers' own tests cover replies holding calls)."""
    with running_server(engine, enable_auto_tool_choice=True, tool_call_parser="hermes") as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model=engine.model_name, messages=ASK_WEATHER,
                                               tools=[WEATHER], temperature=0, max_tokens=12)
        streamed = client.chat.completions.create(model=engine.model_name, messages=ASK_WEATHER,
                                                  tools=[WEATHER], temperature=0, max_tokens=12,
                                                  stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    message = reply.choices[0].message
    assert "<tool_call>" not in message.content and not message.tool_calls
    assert text == message.content
