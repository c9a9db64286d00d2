"""Every error of the API: status code and the OpenAI body shape, and that a bad
request leaves the engine and other requests untouched."""
import json

import httpx
import pytest

from tests.entrypoints.openai.server_utils import (MAX_MODEL_LEN, MAX_NUM_SEQS, running_server,
                                                   wait_engine_idle, wait_until)
from tests.helpers.faults import FAILING_SEED, fail_generator_for_seed

MAX_REQUEST_BYTES = 20_000


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, max_request_bytes=MAX_REQUEST_BYTES,
                        max_num_queued_requests=1) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def check_error(response, status: int, param: str | None = "unset", code: str | None = None,
                says: tuple[str, ...] = ()) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "Traceback" not in error["message"] and ".py" not in error["message"]
    if param != "unset":
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    for fragment in says:
        assert fragment in error["message"], error["message"]
    return error


def completion(http, model_name, **fields):
    return http.post("/v1/completions", json={"model": model_name, "max_tokens": 2, **fields})


def test_malformed_json(http):
    response = http.post("/v1/completions", content=b'{"prompt": "hi",',
                         headers={"content-type": "application/json"})
    check_error(response, 400, code="invalid_json")


@pytest.mark.parametrize("fields, param", [
    ({}, "prompt"),                                     # missing field
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),  # wrong type
    ({"prompt": "hi", "colour": 1}, "colour"),          # unknown field
    ({"prompt": {"text": "hi"}}, None),                 # wrong shape
])
def test_schema_violations(http, model_name, fields, param):
    error = check_error(completion(http, model_name, **fields), 400)
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("fields, param", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": [""]}, None),
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"100000000": 1}}, "logit_bias"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),   # past the engine's max_logprobs
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"echo": True, "logprobs": 21}, "logprobs"),
    ({"best_of": 3, "stream": True}, "best_of"),
    ({"logprobs": 21}, "logprobs"),
])
def test_invalid_sampling_values(http, model_name, fields, param):
    error = check_error(completion(http, model_name, prompt="hi", **fields), 400)
    if param is not None:
        assert error["param"] == param and param in error["message"]


@pytest.mark.parametrize("fields, param", [
    ({"seed": 2**64, "temperature": 0.7}, "seed"),      # once killed the engine
    ({"seed": -2**63 - 1, "temperature": 0.7}, "seed"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"stream": "yes"}, "stream"),
    ({"stop_token_ids": [True]}, None),
])
def test_out_of_range_values_name_the_field(server, http, model_name, fields, param):
    body = json.dumps({"model": model_name, "max_tokens": 2, "prompt": "hi", **fields})
    response = http.post("/v1/completions", content=body.encode(),  # NaN as JSON extensions do
                         headers={"content-type": "application/json"})
    error = check_error(response, 400)
    if param is not None:
        assert error["param"] == param, error
    good = completion(http, model_name, prompt="Hello", max_tokens=3, ignore_eos=True)
    assert good.status_code == 200 and server.app.state.async_engine.is_running


def test_boolean_token_prompt_is_refused(http, model_name):
    check_error(completion(http, model_name, prompt=[True, False]), 400, param="prompt")


def test_a_request_failing_in_the_engine_fails_alone(server, http, model_name, monkeypatch):
    """A fault that is one request's gives that request a 500 (JSON, or an error event
    when streamed) and leaves the engine serving the others."""
    fail_generator_for_seed(monkeypatch)
    bad = dict(prompt="hi", temperature=0.7, seed=FAILING_SEED)
    check_error(completion(http, model_name, **bad), 500, code="request_failed", says=("boom",))
    streamed = completion(http, model_name, stream=True, **bad)
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "request_failed"
    good = completion(http, model_name, prompt="Hello", max_tokens=3, ignore_eos=True)
    assert good.status_code == 200 and server.app.state.async_engine.is_running
    assert wait_engine_idle(server)


def test_invalid_chat_values(http, model_name):
    check_error(http.post("/v1/chat/completions", json={"model": model_name, "messages": []}),
                400, param="messages")
    bad_role = {"model": model_name, "messages": [{"role": "wizard", "content": "hi"}]}
    check_error(http.post("/v1/chat/completions", json=bad_role), 400)
    check_error(http.post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": "hi"}],
        "top_logprobs": 2}), 400)


@pytest.mark.parametrize("prompt", ["", [], [""]])
def test_empty_prompt(http, model_name, prompt):
    check_error(completion(http, model_name, prompt=prompt), 400, param="prompt",
                code="empty_prompt")


def test_prompt_plus_max_tokens_beyond_context(http, model_name):
    prompt = [100] * 20
    error = check_error(completion(http, model_name, prompt=prompt, max_tokens=MAX_MODEL_LEN),
                        400, code="context_length_exceeded")
    for number in (MAX_MODEL_LEN, 20 + MAX_MODEL_LEN, 20):
        assert str(number) in error["message"]
    chat = http.post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": MAX_MODEL_LEN})
    check_error(chat, 400, code="context_length_exceeded", says=(str(MAX_MODEL_LEN),))


def test_prompt_alone_beyond_context(http, model_name):
    response = completion(http, model_name, prompt=[100] * (MAX_MODEL_LEN + 5),
                          max_tokens=None)
    check_error(response, 400, code="context_length_exceeded",
                says=(str(MAX_MODEL_LEN), str(MAX_MODEL_LEN + 5)))


def test_out_of_vocabulary_token_ids(http, model_name, engine):
    vocab = engine.vocab_size
    check_error(completion(http, model_name, prompt=[1, 2, vocab]), 400, param="prompt",
                code="token_out_of_vocabulary", says=(str(vocab),))
    check_error(completion(http, model_name, prompt=[-1]), 400, param="prompt")


def test_unknown_model(http):
    error = check_error(completion(http, "gpt-17", prompt="hi"), 404, param="model",
                        code="model_not_found")
    assert "gpt-17" in error["message"]
    chat = http.post("/v1/chat/completions",
                     json={"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]})
    check_error(chat, 404, param="model")


def test_unknown_route_and_method(http):
    check_error(http.get("/v1/nothing"), 404)
    check_error(http.get("/v1/completions"), 405)


def test_body_too_large(http, model_name):
    big = json.dumps({"model": model_name, "prompt": "x " * MAX_REQUEST_BYTES}).encode()
    check_error(http.post("/v1/completions", content=big), 413, code="request_too_large",
                says=(str(MAX_REQUEST_BYTES),))

    def chunked():  # no Content-Length: the limit holds while reading
        for start in range(0, len(big), 4096):
            yield big[start:start + 4096]
    check_error(http.post("/v1/completions", content=chunked()), 413)


def test_queue_full_gives_503_with_retry_after(server, http, model_name):
    """MAX_NUM_SEQS long requests run, one more waits; the next is refused."""
    long_request = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 400,
                    "ignore_eos": True, "stream": True}
    streams = []
    with httpx.Client(base_url=server.base_url, timeout=60) as other:
        try:
            for _ in range(MAX_NUM_SEQS + 1):
                stream = other.stream("POST", "/v1/completions", json=long_request)
                streams.append(stream)
                stream.__enter__()
            engine = server.app.state.async_engine
            assert wait_until(lambda: engine.num_waiting >= 1)
            refused = completion(http, model_name, prompt="hi")
            check_error(refused, 503, code="queue_full")
            assert int(refused.headers["retry-after"]) >= 1
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    assert wait_engine_idle(server)


def test_bad_requests_leave_engine_and_others_fine(server, http, model_name):
    good = completion(http, model_name, prompt="Hello", max_tokens=3, ignore_eos=True)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3
    assert wait_engine_idle(server)
    assert server.app.state.async_engine.is_running
