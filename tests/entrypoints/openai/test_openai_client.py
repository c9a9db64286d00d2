"""The official `openai` client against a live server on the embedded model."""
import asyncio

import httpx
import openai
import pytest

from tests.entrypoints.openai.server_utils import MAX_MODEL_LEN, metric_value, wait_engine_idle

PROMPT = "The capital of France is"
GREEDY = dict(temperature=0.0, max_tokens=8)


def test_models_health_and_no_auth_needed(server, client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert models.data[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    plain = httpx.get(f"{server.base_url}/v1/models")  # no Authorization header
    assert plain.status_code == 200


def test_completion_usage_and_finish(client, model_name, engine):
    result = client.completions.create(model=model_name, prompt=PROMPT, **GREEDY,
                                       extra_body={"ignore_eos": True})
    choice = result.choices[0]
    assert result.object == "text_completion" and result.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and choice.text
    assert result.usage.prompt_tokens == len(engine.tokenizer.encode(PROMPT))
    assert result.usage.completion_tokens == 8
    assert result.usage.total_tokens == result.usage.prompt_tokens + 8


def test_completion_stream_equals_non_stream(client, model_name):
    whole = client.completions.create(model=model_name, prompt=PROMPT, **GREEDY)
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_token_id_prompt(client, model_name, engine):
    ids = engine.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=model_name, prompt=ids, **GREEDY)
    by_text = client.completions.create(model=model_name, prompt=PROMPT, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_chat_stream_equals_non_stream(client, model_name):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 10
    chunks = list(client.chat.completions.create(
        model=model_name, messages=messages, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage == whole.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason


def test_max_completion_tokens(client, model_name):
    result = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Count to fifty."}],
        max_completion_tokens=3, temperature=0.0, extra_body={"ignore_eos": True})
    assert result.usage.completion_tokens == 3 and result.choices[0].finish_reason == "length"


@pytest.mark.parametrize("max_tokens", ["absent", None])
def test_completions_default_to_16_tokens(server, max_tokens):
    """OpenAI's default: absent or null max_tokens is 16 (null used to run to the context's
    end)."""
    body = {"prompt": PROMPT, "ignore_eos": True}
    if max_tokens != "absent":
        body["max_tokens"] = max_tokens
    result = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    assert result["usage"]["completion_tokens"] == 16
    assert result["choices"][0]["finish_reason"] == "length"


def test_chat_without_max_tokens_fills_the_context(client, model_name, engine):
    """As vLLM: chat with no limit generates up to the end of the context window (a prompt
    ~16 tokens short of it: each token generated on the way is a CPU decode step)."""
    messages = [{"role": "user", "content": "word " * 465}]
    num_prompt = len(engine.apply_chat_template(messages))
    assert num_prompt < MAX_MODEL_LEN - 8
    result = client.chat.completions.create(model=model_name, messages=messages,
                                            max_tokens=None, extra_body={"ignore_eos": True})
    assert result.usage.prompt_tokens == num_prompt
    assert result.usage.total_tokens == MAX_MODEL_LEN
    assert result.choices[0].finish_reason == "length"


def test_stop_string(client, model_name):
    free = client.completions.create(model=model_name, prompt=PROMPT, temperature=0.0,
                                     max_tokens=16, extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text.strip().split()[1]  # a word from the middle of the greedy text
    stopped = client.completions.create(model=model_name, prompt=PROMPT, temperature=0.0,
                                        max_tokens=16, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stop not in stopped.choices[0].text
    assert text.startswith(stopped.choices[0].text)


def test_seed_reproducibility(client, model_name):
    def sample(seed):
        return client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(seed) != first for seed in (1, 2, 3))


def test_logprobs(client, model_name):
    result = client.completions.create(model=model_name, prompt=PROMPT, logprobs=2, **GREEDY)
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == result.usage.completion_tokens == len(lp.token_logprobs)
    assert "".join(lp.tokens) == result.choices[0].text
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(top) == 2 for top in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert all(max(top.values()) == pytest.approx(v, abs=1e-5)
               for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    chat = client.chat.completions.create(model=model_name, logprobs=True, top_logprobs=3,
                                          messages=[{"role": "user", "content": "Hi"}], **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in content)


def test_concurrent_requests_and_priority(server, model_name):
    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x",
                                     max_retries=0)
        calls = [aclient.completions.create(model=model_name, prompt=f"{i} plus {i} is",
                                            max_tokens=6, temperature=0.0,
                                            extra_body={"ignore_eos": True, "priority": i % 2})
                 for i in range(6)]
        return await asyncio.gather(*calls)
    results = asyncio.run(run())
    assert [r.usage.completion_tokens for r in results] == [6] * 6
    assert wait_engine_idle(server)


def test_metrics_count_requests(server, client, model_name):
    url = server.base_url
    before = {name: metric_value(url, name) for name in (
        "parashift_request_success_total", "parashift_generation_tokens_total",
        "parashift_prompt_tokens_total", "parashift_time_to_first_token_seconds_count",
        "parashift_e2e_request_latency_seconds_count")}
    results = [client.completions.create(model=model_name, prompt=PROMPT, max_tokens=n,
                                         temperature=0.0, extra_body={"ignore_eos": True})
               for n in (2, 5)]
    after = {name: metric_value(url, name) for name in before}
    assert after["parashift_request_success_total"] - before[
        "parashift_request_success_total"] == 2
    assert after["parashift_generation_tokens_total"] - before[
        "parashift_generation_tokens_total"] == 7
    assert after["parashift_prompt_tokens_total"] - before["parashift_prompt_tokens_total"] == \
        sum(r.usage.prompt_tokens for r in results)
    assert after["parashift_time_to_first_token_seconds_count"] - before[
        "parashift_time_to_first_token_seconds_count"] == 2
    assert after["parashift_e2e_request_latency_seconds_count"] - before[
        "parashift_e2e_request_latency_seconds_count"] == 2
    assert metric_value(url, "parashift_steps_total") > 0
    assert metric_value(url, "parashift_step_duration_seconds_count") > 0
    assert metric_value(url, "parashift_plan_info") == 1
    assert metric_value(url, "parashift_kv_blocks_total") == server.app.state.async_engine \
        .engine.stats().num_total_blocks
    assert metric_value(url, "parashift_request_success_total", finish_reason="length") >= 2
