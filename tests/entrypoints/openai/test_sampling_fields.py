"""The sampling fields beyond temperature and top-p, through the `openai` client:
penalties, logit_bias, n, best_of and echo."""
import pytest

PROMPT = "List the colours of the rainbow:"
GREEDY = dict(temperature=0.0, max_tokens=12)
CHAT = [{"role": "user", "content": "Say something about cats."}]


def complete(client, model_name, **fields):
    extra = {name: fields.pop(name) for name in ("repetition_penalty", "ignore_eos")
             if name in fields}
    return client.completions.create(model=model_name, prompt=PROMPT, extra_body=extra,
                                     **{**GREEDY, **fields})


def token_ids(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def chat_request(model_name) -> dict:
    return dict(model=model_name, messages=CHAT, temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def unpenalized(client, model_name):
    """The greedy completion and chat answer without penalties (the same for each penalty)."""
    return (complete(client, model_name, max_tokens=24, ignore_eos=True),
            client.chat.completions.create(**chat_request(model_name)))


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.0),
                                          ("frequency_penalty", 2.0),
                                          ("repetition_penalty", 3.0)])
def test_penalties_change_a_repetitive_completion(client, model_name, engine, unpenalized,
                                                  field, value):
    plain, plain_chat = unpenalized
    penalized = complete(client, model_name, max_tokens=24, ignore_eos=True, **{field: value})
    ids = token_ids(engine, plain.choices[0].text)
    assert len(set(ids)) < len(ids), "the greedy completion should repeat a token"
    assert penalized.choices[0].text != plain.choices[0].text
    penalized_chat = client.chat.completions.create(**chat_request(model_name), **(
        {"extra_body": {field: value}} if field == "repetition_penalty" else {field: value}))
    assert penalized_chat.choices[0].message.content != plain_chat.choices[0].message.content


def test_logit_bias_forces_and_bans_tokens(client, model_name, engine):
    forced = token_ids(engine, " banana")[0]
    result = complete(client, model_name, max_tokens=4, ignore_eos=True,
                      logit_bias={str(forced): 100})
    assert token_ids(engine, result.choices[0].text) == [forced] * 4
    plain = complete(client, model_name, max_tokens=1)
    first = token_ids(engine, plain.choices[0].text)[0]
    banned = complete(client, model_name, max_tokens=1, logit_bias={str(first): -100})
    assert token_ids(engine, banned.choices[0].text)[0] != first


def test_logit_bias_in_chat(client, model_name, engine):
    forced = token_ids(engine, " banana")[0]
    result = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3,
                                            temperature=0, logit_bias={str(forced): 100})
    assert token_ids(engine, result.choices[0].message.content) == [forced] * 3


def test_logit_bias_names_the_bad_token_id(client, model_name, engine):
    import openai
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, model_name, logit_bias={"7": 1, str(engine.vocab_size): 5})
    assert info.value.body["param"] == "logit_bias"
    assert str(engine.vocab_size) in info.value.body["message"]


def test_n_completions(client, model_name):
    result = complete(client, model_name, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.index for c in result.choices] == [0, 1, 2]
    texts = [c.text for c in result.choices]
    assert len(set(texts)) > 1, texts
    again = complete(client, model_name, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.text for c in again.choices] == texts  # seeded: reproducible


def test_n_usage_counts_every_choice(client, model_name):
    result = complete(client, model_name, n=2, temperature=1.0, seed=1, max_tokens=5,
                      ignore_eos=True)
    single = complete(client, model_name, max_tokens=5, ignore_eos=True)
    assert result.usage.prompt_tokens == single.usage.prompt_tokens
    assert result.usage.completion_tokens == 10


def test_n_chat_streamed_and_not(client, model_name):
    fields = dict(model=model_name, messages=CHAT, n=2, temperature=1.0, seed=3, max_tokens=8)
    whole = client.chat.completions.create(**fields)
    assert [c.index for c in whole.choices] == [0, 1]
    chunks = list(client.chat.completions.create(stream=True, **fields))
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                assert choice.index not in finishes
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}


def test_n_completions_streamed(client, model_name):
    fields = dict(n=2, temperature=1.0, seed=5, max_tokens=6)
    whole = complete(client, model_name, **fields)
    texts = {0: "", 1: ""}
    for chunk in complete(client, model_name, stream=True, **fields):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {c.index: c.text for c in whole.choices}


def test_best_of_returns_the_most_likely_samples(client, model_name):
    fields = dict(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    candidates = complete(client, model_name, n=4, logprobs=0, **fields)
    scores = {c.text: sum(c.logprobs.token_logprobs) for c in candidates.choices}
    best = complete(client, model_name, n=2, best_of=4, **fields)
    assert [c.index for c in best.choices] == [0, 1]
    assert best.choices[0].logprobs is None  # not asked for
    want = sorted(scores, key=scores.get, reverse=True)[:2]
    assert [c.text for c in best.choices] == want


def test_echo_prepends_the_prompt(client, model_name, engine):
    plain = complete(client, model_name)
    echoed = complete(client, model_name, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    by_ids = client.completions.create(model=model_name, prompt=engine.tokenizer.encode(PROMPT),
                                       echo=True, **GREEDY)
    assert by_ids.choices[0].text.endswith(PROMPT + plain.choices[0].text)
    streamed = "".join(c.choices[0].text for c in complete(client, model_name, echo=True,
                                                            stream=True) if c.choices)
    assert streamed == echoed.choices[0].text
    two = complete(client, model_name, echo=True, n=2, temperature=1.0, seed=2)
    assert all(c.text.startswith(PROMPT) for c in two.choices)
