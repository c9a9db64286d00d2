"""/openapi.json documents the error responses (OpenAI's error object) of the API routes,
and /metrics as Prometheus' text."""
import httpx
import pytest


@pytest.fixture(scope="module")
def document(server):
    return httpx.get(f"{server.base_url}/openapi.json").json()


@pytest.mark.parametrize("path, method, statuses", [
    ("/v1/completions", "post", {"400", "401", "404", "413", "500", "503"}),
    ("/v1/chat/completions", "post", {"400", "401", "404", "413", "500", "503"}),
    ("/v1/responses", "post", {"400", "401", "404", "413", "500", "503"}),
    ("/tokenize", "post", {"400", "401", "404", "413"}),
    ("/detokenize", "post", {"400", "401", "404"}),
    ("/v1/models", "get", {"401"}),
    ("/health", "get", {"503"}),
    ("/ready", "get", {"503"}),
])
def test_error_responses_are_documented_with_the_error_object(document, path, method,
                                                              statuses):
    responses = document["paths"][path][method]["responses"]
    assert statuses <= set(responses)
    for status in statuses:
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema["$ref"] == "#/components/schemas/ErrorResponse"
    error = document["components"]["schemas"]["ErrorInfo"]
    assert {"message", "type"} <= set(error["required"]) and "param" in error["properties"]


def test_metrics_are_documented_as_text(document, server):
    content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]
    assert httpx.get(f"{server.base_url}/metrics").headers["content-type"].startswith(
        "text/plain")


def test_a_documented_error_is_what_the_route_answers(server):
    reply = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "n": 0})
    assert reply.status_code == 400 and set(reply.json()["error"]) == {"message", "type",
                                                                       "param", "code"}
