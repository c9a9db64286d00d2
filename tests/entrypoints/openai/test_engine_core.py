"""The OpenAI server around an engine core in a process of its own (`--engine-core-process`):
the same completions as the server around the engine in its own process, streams with stop
strings and n > 1, a bad request answered 400 while the others go on, and the metrics."""
import httpx
import openai
import pytest

from parashift.config import EngineConfig
from parashift.engine.core_client import EngineCoreClient
from tests.entrypoints.openai.server_utils import (MAX_MODEL_LEN, MAX_NUM_SEQS, metric_value,
                                                   running_server)

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def core_server():
    engine = EngineCoreClient(EngineConfig(device="cpu", dtype="float32",
                                           max_model_len=MAX_MODEL_LEN,
                                           max_num_seqs=MAX_NUM_SEQS, num_blocks=256, seed=0))
    try:
        with running_server(engine) as server:
            yield server
    finally:
        engine.shutdown()


def test_the_same_completions_as_in_one_process(core_server, client, model_name):
    core = openai.OpenAI(base_url=f"{core_server.base_url}/v1", api_key="unused",
                         max_retries=0)
    for options in (dict(temperature=0.0, max_tokens=12),
                    dict(temperature=0.0, max_tokens=30, stop=[" is", "."]),
                    dict(temperature=0.8, max_tokens=6, n=2, seed=7)):
        want = client.completions.create(model=model_name, prompt=PROMPT, **options)
        got = core.completions.create(model=model_name, prompt=PROMPT, **options)
        assert [(c.text, c.finish_reason) for c in got.choices] == [
            (c.text, c.finish_reason) for c in want.choices]
        assert got.usage == want.usage
        chunks = list(core.completions.create(model=model_name, prompt=PROMPT, stream=True,
                                              **options))
        texts = {}
        for chunk in chunks:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
        assert [texts[i] for i in sorted(texts)] == [c.text for c in want.choices]


def test_a_bad_request_is_a_400_and_the_core_serves_on(core_server, model_name):
    url = f"{core_server.base_url}/v1/completions"
    bad = httpx.post(url, json={"model": model_name, "prompt": [10**7], "max_tokens": 4})
    assert bad.status_code == 400 and "out of vocabulary" in bad.json()["error"]["message"]
    long = httpx.post(url, json={"model": model_name, "prompt": PROMPT,
                                 "max_tokens": MAX_MODEL_LEN * 2})
    assert long.status_code == 400
    good = httpx.post(url, json={"model": model_name, "prompt": PROMPT, "max_tokens": 4,
                                 "temperature": 0})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4
    # the steps the core ran, from the records each of its step messages carries
    assert metric_value(core_server.base_url, "parashift_steps_total") > 0
    assert metric_value(core_server.base_url, "parashift_step_duration_seconds_count") > 0
    assert httpx.get(f"{core_server.base_url}/health").status_code == 200
