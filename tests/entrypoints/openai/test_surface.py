"""The rest of vLLM's surface: /tokenize, /detokenize, /version, /ping, the request
schemas in /openapi.json, and the model's path accepted as its name."""
from importlib import metadata

import httpx
import openai
import pytest

import parashift
from parashift.config import EngineConfig
from parashift.engine.llm_engine import LLMEngine
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import MAX_MODEL_LEN, running_server

PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def tokenize(http, **body) -> dict:
    response = http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_tokenize_prompt_is_what_completions_run(http, client, model_name):
    result = tokenize(http, model=model_name, prompt=PROMPT)
    assert set(result) == {"count", "max_model_len", "tokens", "token_strs"}
    assert result["count"] == len(result["tokens"]) and result["token_strs"] is None
    assert result["max_model_len"] == MAX_MODEL_LEN
    completion = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=1)
    assert completion.usage.prompt_tokens == result["count"]
    by_ids = client.completions.create(model=model_name, prompt=result["tokens"], max_tokens=4,
                                       temperature=0.0)
    by_text = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4,
                                        temperature=0.0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_tokenize_token_strs(http, engine):
    result = tokenize(http, prompt=PROMPT, return_token_strs=True)
    assert result["token_strs"] == engine.tokenizer.convert_ids_to_tokens(result["tokens"])


def test_tokenize_messages_is_what_chat_runs(http, client, model_name):
    result = tokenize(http, model=model_name, messages=CHAT)
    chat = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1)
    assert chat.usage.prompt_tokens == result["count"]
    unopened = tokenize(http, messages=CHAT, add_generation_prompt=False)
    assert unopened["count"] < result["count"]
    assert result["tokens"][:unopened["count"]] == unopened["tokens"]


def test_detokenize_inverts_tokenize(http, model_name):
    tokens = tokenize(http, prompt=PROMPT)["tokens"]
    response = http.post("/detokenize", json={"model": model_name, "tokens": tokens})
    assert response.status_code == 200 and response.json() == {"prompt": PROMPT}


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "prompt"),                                          # neither form
    ("/tokenize", {"prompt": "hi", "messages": CHAT}, "prompt"),          # both forms
    ("/tokenize", {"prompt": "hi", "add_generation_prompt": True}, "add_generation_prompt"),
    ("/tokenize", {"prompt": "hi", "colour": 1}, "colour"),               # unknown field
    ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),                    # out of vocabulary
    ("/detokenize", {"tokens": [True]}, "tokens.0"),                      # not an int
])
def test_token_routes_refuse_bad_bodies(http, path, body, param):
    error = error_of(http.post(path, json=body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_token_routes_check_the_model(http):
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        error = error_of(http.post(path, json={"model": "gpt-17", **body}), 404)
        assert error["code"] == "model_not_found"


def test_version_and_ping(http, monkeypatch):
    assert http.get("/version").json() == {"version": metadata.version("parashift")}
    monkeypatch.setattr(parashift.version, "__version__", "9.9.9")  # what /version reads
    assert http.get("/version").json() == {"version": "9.9.9"}
    for method in ("GET", "POST"):
        response = http.request(method, "/ping")
        assert response.status_code == 200 and response.json()["status"] == "ok"


def resolve(document: dict, schema: dict) -> dict:
    name = schema["$ref"].removeprefix("#/components/schemas/")
    return document["components"]["schemas"][name]


@pytest.mark.parametrize("path, required, fields", [
    ("/v1/completions", {"prompt"}, {"max_tokens", "stream", "seed", "temperature"}),
    ("/v1/chat/completions", {"messages"}, {"max_completion_tokens", "logprobs"}),
    ("/tokenize", set(), {"prompt", "messages", "add_generation_prompt"}),
    ("/detokenize", {"tokens"}, {"model"}),
    ("/v1/parallel/layout", {"width"}, {"width"}),
])
def test_openapi_carries_request_schemas(http, path, required, fields):
    document = http.get("/openapi.json").json()
    body = document["paths"][path]["post"]["requestBody"]
    schema = resolve(document, body["content"]["application/json"]["schema"])
    assert body["required"] and schema["additionalProperties"] is False
    assert set(schema.get("required", [])) == required
    assert fields <= set(schema["properties"])
    if path == "/v1/chat/completions":  # nested models resolve too
        message = schema["properties"]["messages"]["items"]
        assert "role" in resolve(document, message)["properties"]
    assert http.get("/docs").status_code == 200


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    engine = LLMEngine(EngineConfig(model=model_dir, device="cpu", dtype="float32",
                                    skip_tokenizer_init=True, num_blocks=64))
    yield engine
    engine.shutdown()


def test_model_path_is_accepted_as_its_name(tiny_engine):
    """As vLLM: `model=<the path given to --model>` works beside the served names (it
    used to be a 404)."""
    path = tiny_engine.config.model
    with running_server(tiny_engine, served_model_names=["tiny"]) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        for name in ("tiny", path):
            result = client.completions.create(model=name, prompt=[1, 2, 3], max_tokens=2,
                                               extra_body={"ignore_eos": True})
            assert result.usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=path + "-other", prompt=[1, 2], max_tokens=1)
        no_tokenizer = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hi"})
        assert error_of(no_tokenizer, 400)["code"] == "no_tokenizer"
