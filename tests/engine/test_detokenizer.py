import os
import random

import pytest
from transformers import AutoTokenizer

from tests.conftest import smollm2_gguf_path
from parashift.engine.detokenizer import IncrementalDetokenizer
from parashift.sampling_params import SamplingParams

TEXTS = [
    "Hello world, this is a test.",
    "日本語のテキストと 中文 and 한국어 mixed in.",
    "Emoji 😀👍🏽🇫🇷 and a family 👨‍👩‍👧 in a row",
    "  leading spaces,   runs   of spaces,\ttabs\t\tand\n\nnewlines\r\n",
    "café naïve Ünïcödé ß ∑∫√ — “quotes” … ½",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
]


@pytest.fixture(scope="module")
def tokenizer():
    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer.encode("<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n")


def stream(tokenizer, prompt_ids, output_ids, params, chunk_sizes=(1,)):
    """Feeds output_ids in chunks; returns (detokenizer, deltas, stop string or None)."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, params)
    deltas, stop, i, sizes = [], None, 0, list(chunk_sizes)
    while i < len(output_ids) and stop is None:
        n = sizes[len(deltas) % len(sizes)]
        stop = detok.append(output_ids[i:i + n])
        deltas.append(detok.take_delta())
        i += n
    deltas.append(detok.take_delta(finished=True))
    return detok, deltas, stop


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_decode(tokenizer, prompt_ids, text):
    ids = tokenizer.encode(text)
    detok, deltas, stop = stream(tokenizer, prompt_ids, ids, SamplingParams())
    assert stop is None
    assert detok.text == tokenizer.decode(ids) == text
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)  # incomplete characters were held back


def test_random_token_sequences_equal_decode(tokenizer, prompt_ids):
    rng = random.Random(0)
    special = list(tokenizer.all_special_ids)
    for trial in range(300):
        length = rng.randint(1, 40)
        ids = [rng.choice(special) if rng.random() < 0.05 else rng.randrange(len(tokenizer))
               for _ in range(length)]
        skip = trial % 2 == 0
        params = SamplingParams(skip_special_tokens=skip)
        prompt = prompt_ids if trial % 3 else []
        detok = IncrementalDetokenizer(tokenizer, prompt, params)
        expected = tokenizer.decode(ids, skip_special_tokens=skip)
        deltas, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            detok.append(ids[i:i + n])
            assert expected.startswith(detok.text)  # text only grows by final characters
            deltas.append(detok.take_delta())
            i += n
        deltas.append(detok.take_delta(finished=True))
        assert detok.text == expected, ids
        assert "".join(deltas) == expected


def test_skip_special_tokens(tokenizer):
    ids = tokenizer.encode("Hi there<|im_end|>")
    assert tokenizer.all_special_ids[1] in ids  # <|im_end|> is one token
    for skip, expected in ((True, "Hi there"), (False, "Hi there<|im_end|>")):
        detok, _, _ = stream(tokenizer, [], ids, SamplingParams(skip_special_tokens=skip))
        assert detok.text == expected


def test_multi_byte_characters_split_over_tokens(tokenizer):
    ids = tokenizer.encode("日本語 😀")
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    deltas = []
    for t in ids:
        detok.append([t])
        deltas.append(detok.take_delta())
        assert "\ufffd" not in detok.text
    assert "".join(deltas) == "日本語 😀"


def test_prompt_ending_inside_a_character(tokenizer):
    ids = tokenizer.encode("日本")  # the first character's bytes span two tokens
    detok = IncrementalDetokenizer(tokenizer, ids[:1], SamplingParams())
    detok.append(ids[1:])
    assert detok.text == "日本"  # the character the output completes belongs to the output


def test_stop_string_across_token_boundary(tokenizer, prompt_ids):
    ids = tokenizer.encode("Hello world, this is a test.")
    assert not any("o wor" in tokenizer.decode([t]) for t in ids)
    detok, deltas, stop = stream(tokenizer, prompt_ids, ids, SamplingParams(stop=["o wor"]))
    assert stop == "o wor" == detok.stop_reason
    assert detok.text == "".join(deltas) == "Hell"


def test_include_stop_str_in_output(tokenizer, prompt_ids):
    ids = tokenizer.encode("Hello world, this is a test.")
    params = SamplingParams(stop=["o wor"], include_stop_str_in_output=True)
    detok, deltas, stop = stream(tokenizer, prompt_ids, ids, params)
    assert stop == "o wor"
    assert detok.text == "".join(deltas) == "Hello wor"  # the rest of the token is dropped


def test_stop_string_inside_one_token(tokenizer):
    ids = tokenizer.encode("Hello world")
    detok, deltas, stop = stream(tokenizer, [], ids, SamplingParams(stop=["ell"]))
    assert (stop, detok.text, "".join(deltas)) == ("ell", "H", "H")


def test_earliest_stop_string_wins(tokenizer):
    ids = tokenizer.encode("Hello world, this is a test.")
    params = SamplingParams(stop=["is a test", "this", "world, th"])
    for chunks in ((1,), (8,)):  # one token at a time, or all at once
        detok, _, stop = stream(tokenizer, [], ids, params, chunks)
        assert (stop, detok.text) == ("world, th", "Hello ")


def test_multi_byte_stop_string(tokenizer):
    detok, deltas, stop = stream(tokenizer, [], tokenizer.encode("日本語です"), SamplingParams(stop=["語"]))
    assert (stop, detok.text, "".join(deltas)) == ("語", "日本", "日本")


def test_stop_string_in_prompt_is_ignored(tokenizer):
    prompt = tokenizer.encode("Say STOP")
    detok, _, stop = stream(tokenizer, prompt, tokenizer.encode(" and go"), SamplingParams(stop=["STOP"]))
    assert stop is None and detok.text == " and go"


def test_stream_withholds_possible_stop_prefix(tokenizer):
    ids = tokenizer.encode("Hello world.")  # Hello | ' world' | '.'
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["world!"]))
    assert detok.append(ids[:2]) is None
    assert detok.take_delta() == "Hello "  # "world" may still become "world!"
    assert detok.text == "Hello world"
    assert detok.append(ids[2:]) is None
    assert detok.take_delta() == "world."


def test_finished_releases_withheld_text(tokenizer):
    ids = tokenizer.encode("Hello world")
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["worlds"]))
    detok.append(ids)
    assert detok.take_delta() == "Hello "
    assert detok.take_delta(finished=True) == "world"
    assert detok.take_delta(finished=True) == ""


def test_deltas_never_leak_stop_strings(tokenizer, prompt_ids):
    rng = random.Random(1)
    text = "The answer is 42.\nObservation: done. The answer is 43.\nObservation: again"
    ids = tokenizer.encode(text)
    stops = ["\nObservation:", "answer is 43", "42.\nObs", "zzz", "e a"]
    for trial in range(40):
        params = SamplingParams(stop=rng.sample(stops, rng.randint(1, 3)),
                                include_stop_str_in_output=trial % 2 == 1)
        detok, deltas, stop = stream(tokenizer, prompt_ids, ids, params, [rng.randint(1, 3)])
        joined = "".join(deltas)
        assert joined == detok.text
        present = [s for s in params.stop if s in text]
        assert stop == (min(present, key=text.find) if present else None)
        if stop is not None:
            cut = text.find(stop) + (len(stop) if params.include_stop_str_in_output else 0)
            assert joined == text[:cut]
        visible = joined[:-len(stop)] if stop and params.include_stop_str_in_output else joined
        assert not any(s in visible for s in params.stop)


def test_append_after_stop_is_ignored(tokenizer):
    ids = tokenizer.encode("Hello world, this is a test.")
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["world"]))
    assert detok.append(ids[:3]) == "world"
    assert detok.append(ids[3:]) is None
    assert detok.text == "Hello " and detok.take_delta() == "Hello "


def test_a_batch_of_requests_detokenizes_as_each_one_alone(tokenizer, prompt_ids):
    """append_all (two Rust batch calls per step) gives every request the text and stop
    string that its own appends give, with and without special tokens and stop strings."""
    from parashift.engine.detokenizer import append_all, rust_backend
    assert rust_backend(tokenizer) is not None
    rng = random.Random(3)
    outputs = [tokenizer.encode(text) + [tokenizer.eos_token_id] for text in TEXTS] + \
        [[rng.randrange(len(tokenizer)) for _ in range(30)] for _ in range(10)]
    params = [SamplingParams(stop=[rng.choice(["a", "é", "😀", ", ", "zz"])],
                             skip_special_tokens=rng.random() < 0.5) for _ in outputs]
    alone = [IncrementalDetokenizer(tokenizer, prompt_ids, p) for p in params]
    batched = [IncrementalDetokenizer(tokenizer, prompt_ids, p) for p in params]
    stops_alone, stops_batched = [None] * len(outputs), [None] * len(outputs)
    for step in range(max(map(len, outputs))):
        live = [i for i, ids in enumerate(outputs) if step < len(ids) and stops_alone[i] is None]
        for i in live:
            stops_alone[i] = alone[i].append([outputs[i][step]])
        for i, stop in zip(live, append_all([batched[i] for i in live],
                                            [outputs[i][step] for i in live])):
            stops_batched[i] = stop
    assert stops_batched == stops_alone and any(stops_alone)
    assert [d.text for d in batched] == [d.text for d in alone]
    assert [d.take_delta(finished=True) for d in batched] == \
        [d.take_delta(finished=True) for d in alone]


def test_a_request_whose_tokens_cannot_be_decoded_fails_alone(tokenizer, prompt_ids):
    from parashift.engine.detokenizer import append_all
    good, bad = (IncrementalDetokenizer(tokenizer, prompt_ids, SamplingParams()) for _ in "ab")
    results = append_all([good, bad], [tokenizer.encode("Hello")[0], -5])
    assert results[0] is None and isinstance(results[1], Exception)
    assert good.text == "Hello"


def test_token_texts_decode_each_step_once_per_request_and_keep_exact_texts(tokenizer,
                                                                           prompt_ids):
    """With TokenTexts, a request's one-token window before its new token is taken from the
    texts known (decoded alone once per token id), and every request gets the text and stop
    string it gets without them; the texts kept are tokenizer.decode's of each id alone."""
    from parashift.engine.detokenizer import TokenTexts, append_all, rust_backend
    rng = random.Random(5)
    outputs = [tokenizer.encode(text) for text in TEXTS] + \
        [[rng.randrange(len(tokenizer)) for _ in range(20)] for _ in range(4)]
    params = [SamplingParams(stop=[rng.choice(["a", "é", "😀", ", "])],
                             skip_special_tokens=i % 2 == 0) for i in range(len(outputs))]
    plain = [IncrementalDetokenizer(tokenizer, prompt_ids, p) for p in params]
    cached = [IncrementalDetokenizer(tokenizer, prompt_ids, p) for p in params]
    texts = TokenTexts()
    stops_plain, stops_cached = [None] * len(outputs), [None] * len(outputs)
    for step in range(max(map(len, outputs))):
        live = [i for i, ids in enumerate(outputs) if step < len(ids) and stops_plain[i] is None]
        step_tokens = [outputs[i][step] for i in live]
        for i, stop in zip(live, append_all([plain[i] for i in live], step_tokens)):
            stops_plain[i] = stop
        for i, stop in zip(live, append_all([cached[i] for i in live], step_tokens, texts)):
            stops_cached[i] = stop
    assert stops_cached == stops_plain and any(stops_plain)
    assert [d.text for d in cached] == [d.text for d in plain]
    backend = rust_backend(tokenizer)
    for skip in (True, False):
        known = texts.of(backend, skip)
        assert known  # every request's windows after its first token are one token long
        assert known == {t: tokenizer.decode([t], skip_special_tokens=skip,
                                             clean_up_tokenization_spaces=False)
                         for t in known}
