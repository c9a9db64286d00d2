"""--generation-config over HTTP: a request's unset fields take the model's generation
config; the fields it sets win; `vllm` ignores the file."""
import json

import httpx
import pytest

from parashift.config import EngineConfig
from parashift.engine.llm_engine import LLMEngine
from parashift.entrypoints.openai.protocol import ChatCompletionRequest
from parashift.entrypoints.openai.serving_base import build_sampling_params
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import running_server

GENERATION = {"max_new_tokens": 3, "temperature": 0.5, "top_k": 7}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    with open(f"{directory}/generation_config.json", "w") as f:
        json.dump(GENERATION, f)
    return directory


def completion_tokens(engine: LLMEngine, **body) -> int:
    with running_server(engine) as server:
        response = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                              json={"prompt": [1, 2, 3], "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("setting, default_tokens", [("auto", 3), ("vllm", 16)])
def test_unset_max_tokens_takes_the_generation_config(model_dir, setting, default_tokens):
    engine = LLMEngine(EngineConfig(model=model_dir, device="cpu", dtype="float32",
                                    skip_tokenizer_init=True, num_blocks=64,
                                    generation_config=setting))
    try:
        assert completion_tokens(engine) == default_tokens
        assert completion_tokens(engine, max_tokens=5) == 5
    finally:
        engine.shutdown()


def test_request_fields_win_over_the_generation_config():
    defaults = {"temperature": 0.5, "top_k": 7, "max_tokens": 3}
    unset = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    params = build_sampling_params(unset, None, None, defaults)
    assert (params.temperature, params.top_k) == (0.5, 7)
    given = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                  temperature=0.0, top_k=3)
    params = build_sampling_params(given, None, None, defaults)
    assert (params.temperature, params.top_k) == (0.0, 3)
