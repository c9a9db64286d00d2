"""/v1/responses through the `openai` client, unchanged: the same greedy text as
/v1/chat/completions of the same conversation, streamed as typed events or not; the fields
it cannot honour are 400s naming them."""
import json

import httpx
import openai
import pytest

GREEDY = {"temperature": 0, "max_output_tokens": 12}


def chat_reply(client, model_name, messages, max_tokens=12):
    reply = client.chat.completions.create(model=model_name, messages=messages, temperature=0,
                                           max_tokens=max_tokens)
    return reply.choices[0], reply.usage


def test_text_input_gives_the_chat_reply(client, model_name):
    response = client.responses.create(model=model_name, input="Name a colour.", **GREEDY)
    choice, usage = chat_reply(client, model_name, [{"role": "user", "content": "Name a colour."}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == choice.message.content
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert response.usage.input_tokens == usage.prompt_tokens
    assert response.usage.output_tokens == usage.completion_tokens
    assert response.usage.total_tokens == usage.total_tokens
    expected = "incomplete" if choice.finish_reason == "length" else "completed"
    assert response.status == expected and response.model == model_name
    if expected == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_messages_and_instructions_give_the_chat_reply(client, model_name):
    response = client.responses.create(
        model=model_name, instructions="Answer in one word.",
        input=[{"role": "user", "content": "Name a fruit."},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Apple."}]},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Another one?"}]}], **GREEDY)
    choice, _ = chat_reply(client, model_name, [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another one?"}])
    assert response.output_text == choice.message.content
    assert response.instructions == "Answer in one word."


def test_streamed_events_join_into_the_reply(client, model_name):
    whole = client.responses.create(model=model_name, input="Tell me a story.", **GREEDY)
    events = list(client.responses.create(model=model_name, input="Tell me a story.",
                                          stream=True, **GREEDY))
    kinds = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", f"response.{whole.status}"]
    assert "".join(deltas) == whole.output_text and len(deltas) > 1
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage == whole.usage
    assert events[0].response.status == "in_progress"


def test_a_reply_that_ends_by_itself_is_completed(client, model_name):
    # greedy SmolLM2 ends this reply at 8 tokens ("Say yes." ran 70: 15 s on a CPU)
    response = client.responses.create(model=model_name, input="What is the capital of France?",
                                       temperature=0, max_output_tokens=200)
    assert response.status == "completed" and response.incomplete_details is None


def test_json_schema_text_format_constrains_the_output(client, model_name):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}},
              "required": ["colour"], "additionalProperties": False}
    response = client.responses.create(
        model=model_name, input="Name a colour as JSON.", temperature=0, max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema}})
    assert set(json.loads(response.output_text)) == {"colour"}


@pytest.mark.parametrize("fields, param, words", [
    ({"tools": [{"type": "web_search"}]}, "tools", "built-in type 'web_search'"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools",
     "/v1/chat/completions"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "not stored"),
    ({"background": True}, "background", "not supported"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "not supported"),
    ({"include": ["message.output_text.logprobs"]}, "include", "not available"),
    ({"truncation": "auto"}, "truncation", "'auto'"),
    ({"top_logprobs": 2}, "top_logprobs", "not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "input",
     "'function_call_output'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input", "'input_image'"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input", "role"),
    ({"input": []}, "input", "empty"),
    ({"conversation": "conv_1"}, "conversation", "unknown field"),
    ({"max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
])
def test_what_it_cannot_honour_is_a_400_naming_the_field(client, model_name, fields, param,
                                                         words):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**{"model": model_name, "input": "hi", **fields})
    error = refused.value.body
    assert error["param"] == param and words in error["message"], error


def test_the_route_is_in_the_openapi_document(server):
    document = httpx.get(f"{server.base_url}/openapi.json").json()
    post = document["paths"]["/v1/responses"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ResponsesRequest")
    assert "ResponsesRequest" in document["components"]["schemas"]
