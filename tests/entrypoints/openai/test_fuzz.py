"""Fuzzing the running server (issue 18): schemathesis draws request bodies from
the server's own /openapi.json and sends them over HTTP to /v1/completions,
/v1/chat/completions, /tokenize and /detokenize. No answer may be a 5xx, every
answer is JSON or a stream ending in `[DONE]` with no error event; afterwards a
plain request still succeeds and the engine still runs.

Three kinds of bodies per route: ones that fit the schema, ones that break it, and
ones that fit it "repaired" past the checks the schema cannot state (the model's
name, token ids within the vocabulary, the neutral value of the fields parashift
does not implement), so that drawn sampling parameters reach the engine.

The run is repeatable (hypothesis derandomized, no example database) and bounded:
EXAMPLES_PER_ROUTE bodies per route, at least MIN_REQUESTS in all, each generating
at most SMALL_MAX_TOKENS tokens (16, OpenAI's default, where a completion's
max_tokens is null), on a tiny random model with SmolLM2's tokenizer. schemathesis and
hypothesis come with the `test` extra."""
import json

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.entrypoints.openai.server_utils import MAX_MODEL_LEN, server_engine, wait_engine_idle
from tests.helpers.tiny_smollm2 import save_tiny_smollm2

GENERATING = ("/v1/completions", "/v1/chat/completions")
ROUTES = (*GENERATING, "/tokenize", "/detokenize")
EXAMPLES_PER_ROUTE = 150
MIN_REQUESTS = 500
MIN_SERVED = 100  # answered 200: the fuzz must not turn into 400s alone
SMALL_MAX_TOKENS = 4
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")
NEUTRAL_ONLY = ("model", "suffix")
SAMPLE_FIELDS = ("n", "best_of")  # kept small: each sample is a sequence to generate
MAX_FUZZ_SAMPLES = 2
TOKEN_FIELDS = ("prompt", "tokens", "stop_token_ids")
FUZZ_SETTINGS = settings(max_examples=EXAMPLES_PER_ROUTE, derandomize=True, database=None,
                         deadline=None, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                         suppress_health_check=list(HealthCheck), print_blob=False)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The shared engine's options on a tiny random model that speaks SmolLM2's tokens: the
    fuzz tests the server, where a generated token of SmolLM2 cost ~100 times as much."""
    engine = server_engine(model=save_tiny_smollm2(tmp_path_factory.mktemp("tiny_smollm2")))
    yield engine
    engine.shutdown()


def keep_short(route: str, body) -> None:
    """Bounds what a body makes the engine generate. Limits a request cannot fit
    (negative, zero, past the context) and non-integers stay as drawn: they are
    what the server must refuse."""
    if not isinstance(body, dict) or route not in GENERATING:
        return
    for name in LIMIT_FIELDS:
        value = body.get(name)
        if type(value) is int and SMALL_MAX_TOKENS < value <= MAX_MODEL_LEN:
            body[name] = SMALL_MAX_TOKENS
    numbers = {name: body.get(name) for name in SAMPLE_FIELDS
               if type(body.get(name)) in (int, float)}  # pydantic takes 71.0 as 71
    for name, value in numbers.items():
        if value > MAX_FUZZ_SAMPLES:
            body[name] = MAX_FUZZ_SAMPLES
    if any(value > 1 for value in numbers.values()):
        # schemathesis reads at most 20 events of a stream: several samples get 4 tokens each
        body.update({name: SMALL_MAX_TOKENS for name in LIMIT_FIELDS if name in body})
        body.setdefault("max_tokens", SMALL_MAX_TOKENS)
    if route == "/v1/chat/completions" and all(body.get(name) is None for name in LIMIT_FIELDS):
        body["max_tokens"] = SMALL_MAX_TOKENS  # chat with no limit runs to the context end


def repaired(vocab_size: int):
    """Maps a schema-valid case to one the server's own checks accept too."""
    def in_vocabulary(value):
        if type(value) is int:
            return value % vocab_size
        if isinstance(value, list):
            return [in_vocabulary(item) for item in value]
        return value

    def repair(case):
        body = case.body
        for name in NEUTRAL_ONLY:
            body.pop(name, None)
        for name in TOKEN_FIELDS:
            if name in body:
                body[name] = in_vocabulary(body[name])
        if body.get("prompt") in ("", []) or (not body.get("messages") and "tokens" not in body):
            body["prompt"] = body.get("prompt") or "Hello"
        if body.get("stream_options") is not None:
            body["stream"] = True
        if "messages" in body and "prompt" in body:  # /tokenize takes one form
            body.pop("messages")
        body.pop("add_generation_prompt" if "prompt" in body else "add_special_tokens", None)
        if not body.get("logprobs"):
            body.pop("top_logprobs", None)
        return case
    return repair


def content_type(response) -> str:
    return (response.headers.get("content-type") or [""])[0]  # header values come as lists


def stream_errors(response) -> list[dict]:
    """The error events of an SSE body."""
    if not content_type(response).startswith("text/event-stream"):
        return []
    events = [line.removeprefix("data: ") for line in response.text.splitlines()
              if line.startswith("data: ")]
    return [event["error"] for event in map(json.loads, filter("[DONE]".__ne__, events))
            if "error" in event]


def check_answer(case, response) -> None:
    sent = json.dumps(case.body, default=repr)[:2000]
    assert response.status_code < 500, \
        f"{case.path} answered {response.status_code} {response.text[:500]} to {sent}"
    kind = content_type(response)
    assert kind.startswith(("application/json", "text/event-stream")), \
        f"{case.path} answered {kind}: {response.text[:200]}"
    assert not stream_errors(response), f"{case.path} streamed {stream_errors(response)} " \
                                        f"for {sent}"
    if kind.startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]"), response.text[-500:]


@pytest.mark.timeout(1200)
def test_fuzz_never_answers_5xx(server, client, engine, model_name):
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    sent = {route: 0 for route in ROUTES}
    served = 0
    with requests.Session() as session:
        for route in ROUTES:
            operation = schema[route]["POST"]
            valid = operation.as_strategy(schemathesis.GenerationMode.POSITIVE)
            bodies = st.one_of(valid, valid.map(repaired(engine.vocab_size)),
                               operation.as_strategy(schemathesis.GenerationMode.NEGATIVE))

            @FUZZ_SETTINGS
            @given(case=bodies)
            def fuzz(case):
                nonlocal served
                keep_short(route, case.body)
                response = case.call(base_url=server.base_url, session=session, timeout=120)
                sent[route] += 1
                served += response.status_code == 200
                check_answer(case, response)

            fuzz()
    assert sum(sent.values()) >= MIN_REQUESTS and served >= MIN_SERVED, (sent, served)

    assert server.app.state.async_engine.is_running
    assert requests.get(f"{server.base_url}/health", timeout=10).status_code == 200
    result = client.completions.create(model=model_name, prompt="The capital of France is",
                                       max_tokens=3, temperature=0.0,
                                       extra_body={"ignore_eos": True})
    assert result.choices[0].text and result.usage.completion_tokens == 3
    assert wait_engine_idle(server)
