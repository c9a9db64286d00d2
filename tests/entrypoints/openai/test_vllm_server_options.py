"""vLLM's server options at work, on one server: --response-role, --scheduling-policy fcfs,
--enable-log-requests with --max-log-len, --disable-fastapi-docs, --allowed-origins; the
engine's --max-logprobs over HTTP; what uvicorn is given (--uvicorn-log-level, SSL, a Unix
socket, --root-path)."""
import contextlib
import logging

import httpx
import openai
import pytest

from parashift.entrypoints.openai.launcher import uvicorn_options
from parashift.entrypoints.openai.server_config import ServerConfig
from tests.entrypoints.openai.server_utils import running_server

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, response_role="bot", scheduling_policy="fcfs",
                        enable_log_requests=True, max_log_len=3, disable_fastapi_docs=True,
                        allowed_origins=[ORIGIN]) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@contextlib.contextmanager
def request_log_lines():
    lines = []
    handler = logging.Handler(level=logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("parashift.entrypoints.openai.request_log")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_response_role_names_the_reply(client, model_name):
    messages = [{"role": "user", "content": "Hi"}]
    reply = client.chat.completions.create(model=model_name, messages=messages, max_tokens=2)
    assert reply.choices[0].message.role == "bot"
    chunks = list(client.chat.completions.create(model=model_name, messages=messages,
                                                 max_tokens=2, stream=True))
    assert chunks[0].choices[0].delta.role == "bot"


def test_fcfs_refuses_a_priority(http):
    refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "priority": 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert "--scheduling-policy priority" in refused.json()["error"]["message"]
    assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1,
                                              "priority": 0}).status_code == 200


def test_each_request_is_logged_with_its_prompt_cut(http):
    with request_log_lines() as lines:
        reply = http.post("/v1/completions", json={"prompt": [5, 6, 7, 8, 9], "max_tokens": 1})
    assert reply.status_code == 200
    (line,) = lines
    assert line.startswith(f"Received request {reply.json()['id']}") and "[5, 6, 7]" in line
    assert "[5, 6, 7, 8" not in line


def test_no_docs_nor_schema(http):
    assert http.get("/openapi.json").status_code == 404
    assert http.get("/docs").status_code == 404


def test_cors_answers_the_allowed_origin_only(http):
    def preflight(origin):
        return http.options("/v1/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert preflight(ORIGIN).headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-origin" not in preflight("https://other.example").headers


@pytest.mark.parametrize("fields, param", [({"logprobs": 21}, "logprobs")])
def test_more_logprobs_than_max_logprobs_is_a_400(http, fields, param):
    refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, **fields})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == param
    assert "max_logprobs (20)" in error["message"] and "--max-logprobs" in error["message"]
    assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1,
                                              "logprobs": 20}).status_code == 200


def test_chat_top_logprobs_above_the_cap_is_a_400(client, model_name):
    with pytest.raises(openai.BadRequestError, match="max_logprobs"):
        client.chat.completions.create(model=model_name, max_tokens=1, logprobs=True,
                                       top_logprobs=21,
                                       messages=[{"role": "user", "content": "Hi"}])


def test_uvicorn_is_given_the_vllm_options():
    config = ServerConfig(uvicorn_log_level="debug", root_path="/api", uds="/tmp/p.sock",
                          ssl_keyfile="k.pem", ssl_certfile="c.pem", ssl_ca_certs="ca.pem",
                          ssl_cert_reqs=2, ssl_ciphers="ECDHE-RSA-AES256-GCM-SHA384",
                          log_config_file="log.json")
    given = uvicorn_options(config)
    assert {key: given[key] for key in ("log_level", "root_path", "uds", "ssl_keyfile",
                                        "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs",
                                        "ssl_ciphers", "log_config")} == {
        "log_level": "debug", "root_path": "/api", "uds": "/tmp/p.sock", "ssl_keyfile": "k.pem",
        "ssl_certfile": "c.pem", "ssl_ca_certs": "ca.pem", "ssl_cert_reqs": 2,
        "ssl_ciphers": "ECDHE-RSA-AES256-GCM-SHA384", "log_config": "log.json"}
    plain = uvicorn_options(ServerConfig(log_level="warning"))
    assert plain["log_level"] == "warning" and "log_config" not in plain
    assert "ssl_ciphers" not in plain
