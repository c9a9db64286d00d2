"""/v1/completions with a batch of prompts, `echo` with `logprobs`, and vLLM's
`prompt_logprobs`, through the `openai` client; their bad inputs are 400s."""
import math

import httpx
import openai
import pytest

PROMPTS = ["The capital of France is", "One, two, three,", "Roses are red"]
GREEDY = dict(temperature=0.0, max_tokens=5, ignore_eos=True)


def complete(client, model_name, prompt, **fields):
    fields = {**GREEDY, **fields}
    extra = {name: fields.pop(name) for name in ("ignore_eos", "prompt_logprobs")
             if name in fields}
    return client.completions.create(model=model_name, prompt=prompt, extra_body=extra,
                                     **fields)


@pytest.fixture(scope="module")
def singles(client, model_name):
    return [complete(client, model_name, p).choices[0].text for p in PROMPTS]


def test_a_batch_of_texts_gives_a_choice_per_prompt_and_sample(client, model_name, singles):
    batch = complete(client, model_name, PROMPTS, n=2)
    assert [c.index for c in batch.choices] == list(range(2 * len(PROMPTS)))
    assert [c.text for c in batch.choices] == [t for t in singles for _ in range(2)]
    single_usage = [complete(client, model_name, p).usage for p in PROMPTS]
    assert batch.usage.prompt_tokens == sum(u.prompt_tokens for u in single_usage)
    assert batch.usage.completion_tokens == 2 * len(PROMPTS) * GREEDY["max_tokens"]


def test_a_batch_of_token_lists(client, model_name, engine, singles):
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    batch = complete(client, model_name, ids)
    assert [c.text for c in batch.choices] == singles
    one = complete(client, model_name, ids[0])  # a single token list stays one prompt
    assert [c.text for c in one.choices] == singles[:1]


def test_a_streamed_batch(client, model_name, singles):
    texts, usage = {}, None
    for chunk in complete(client, model_name, PROMPTS, n=2, stream=True,
                          stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
        usage = chunk.usage or usage
    assert texts == {i: singles[i // 2] for i in range(2 * len(PROMPTS))}
    assert usage.completion_tokens == 2 * len(PROMPTS) * GREEDY["max_tokens"]


def prompt_logprob_values(choice) -> list:
    """The prompt tokens' logprobs of a choice's vLLM `prompt_logprobs` field."""
    entries = choice.model_extra["prompt_logprobs"]
    assert entries[0] is None
    return entries


def test_echo_with_logprobs_scores_the_prompt(client, model_name, engine):
    prompt = PROMPTS[0]
    ids = engine.tokenizer.encode(prompt)
    plain = complete(client, model_name, prompt, logprobs=2)
    echoed = complete(client, model_name, prompt, logprobs=2, echo=True)
    scored = complete(client, model_name, prompt, prompt_logprobs=2)
    choice, logprobs = echoed.choices[0], echoed.choices[0].logprobs
    assert choice.text == prompt + plain.choices[0].text
    assert len(logprobs.tokens) == len(ids) + GREEDY["max_tokens"]
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(logprobs.text_offset,
                                                  logprobs.text_offset[1:], logprobs.tokens))
    assert logprobs.token_logprobs[len(ids):] == plain.choices[0].logprobs.token_logprobs
    entries = prompt_logprob_values(scored.choices[0])
    assert len(entries) == len(ids)
    for token_id, entry, value in zip(ids[1:], entries[1:], logprobs.token_logprobs[1:]):
        assert math.isclose(entry[str(token_id)]["logprob"], value, rel_tol=1e-6)
        assert value <= 0 and entry[str(token_id)]["rank"] >= 1
        assert len(entry) in (2, 3)  # the prompt token and the top 2


def test_streamed_echo_with_logprobs(client, model_name):
    whole = complete(client, model_name, PROMPTS[:2], logprobs=1, echo=True)
    tokens, logprobs = {}, {}
    for chunk in complete(client, model_name, PROMPTS[:2], logprobs=1, echo=True,
                          stream=True):
        for c in chunk.choices:
            tokens.setdefault(c.index, []).extend(c.logprobs.tokens)
            logprobs.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
    for c in whole.choices:
        assert tokens[c.index] == c.logprobs.tokens
        assert logprobs[c.index] == c.logprobs.token_logprobs


def test_chat_prompt_logprobs(client, model_name):
    reply = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, extra_body={"prompt_logprobs": 1})
    entries = reply.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == reply.usage.prompt_tokens
    assert all(-math.inf < lp["logprob"] <= 0 for e in entries[1:] for lp in e.values())


@pytest.mark.parametrize("prompt, code", [
    (["a text", [1, 2, 3]], "mixed_prompt_batch"),
    ([[1, 2], "a text"], "mixed_prompt_batch"),
    ([], "empty_prompt"),
    (["fine", ""], "empty_prompt"),
])
def test_bad_batches_are_400s(server, model_name, prompt, code):
    response = httpx.post(f"{server.base_url}/v1/completions",
                          json={"model": model_name, "prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["code"] == code, error


def test_prompt_logprobs_past_the_limit_is_a_400(client, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, model_name, PROMPTS[0], prompt_logprobs=21)
    assert info.value.body["param"] == "prompt_logprobs"
    assert "20" in info.value.body["message"]
