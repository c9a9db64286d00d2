"""--api-key: every /v1 route, /tokenize and /detokenize need the bearer token; /health,
/ping, /version and /metrics do not."""
import httpx
import openai
import pytest

from parashift.entrypoints.openai.auth import API_KEY_ENV, resolve_api_key
from tests.entrypoints.openai.server_utils import running_server

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, api_key=KEY) as srv:
        yield srv


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}])
@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                          ("POST", "/v1/chat/completions"),
                                          ("POST", "/tokenize"), ("POST", "/detokenize")])
def test_missing_or_wrong_key_is_401(server, headers, method, path):
    response = httpx.request(method, f"{server.base_url}{path}", headers=headers,
                             json={"prompt": "hi"})
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert KEY not in error["message"]


def test_right_key_works_with_openai_client(server, model_name):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)
    result = client.completions.create(model=model_name, prompt="Hi", max_tokens=2)
    assert result.usage.completion_tokens <= 2
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics"])
def test_health_and_metrics_need_no_key(server, path):
    assert httpx.get(f"{server.base_url}{path}").status_code == 200


def test_key_from_flag_or_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(None) is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("from-flag") == "from-flag"
