"""Structured output on the embedded SmolLM2 (CPU): sampled outputs follow their
constraint, the request ends when the grammar does, bad constraints are refused."""
import json

import jsonschema
import pytest

from parashift import LLM, SamplingParams
from parashift.structured import StructuredOutputsParams
from parashift.structured.matchers import NO_CONTINUATION

# Short and bounded, so that 40 tokens always hold a whole object.
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]


@pytest.fixture(scope="module")
def llm(single_torch_thread):
    with LLM(device="cpu", dtype="float32", max_num_seqs=100, seed=0) as llm:
        yield llm


def sampled(constraint: StructuredOutputsParams, max_tokens: int, **options) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=max_tokens, structured_outputs=constraint,
                          **options)


def test_hundred_sampled_outputs_follow_the_schema(llm):
    params = [sampled(StructuredOutputsParams(json=PERSON), 40, seed=i) for i in range(100)]
    outputs = llm.chat([ASK] * 100, params)
    texts = [o.outputs[0].text for o in outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs)
    assert len(set(texts)) > 10  # sampled, not one greedy answer


def test_schema_as_json_text_and_json_object(llm):
    by_text = sampled(StructuredOutputsParams(json=json.dumps(PERSON)), 40, seed=1)
    any_object = sampled(StructuredOutputsParams(json_object=True), 48, seed=2,
                         stop_token_ids=[])
    outputs = llm.chat([ASK, ASK], [by_text, any_object])
    jsonschema.validate(json.loads(outputs[0].outputs[0].text), PERSON)
    if outputs[1].outputs[0].finish_reason == "stop":  # a free object may outgrow 48 tokens
        assert isinstance(json.loads(outputs[1].outputs[0].text), dict)
    else:
        assert outputs[1].outputs[0].text.startswith("{")


def test_regex_and_choice(llm):
    regex = StructuredOutputsParams(regex=r"\d{3}-\d{4}")
    choices = ["red", "green", 'a "quoted" blue']
    choice = StructuredOutputsParams(choice=choices)
    prompts = ["My phone number is"] * 8 + ["My favourite colour is"] * 8
    params = [sampled(regex, 16, seed=i) for i in range(8)] + \
             [sampled(choice, 16, seed=i) for i in range(8)]
    outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for out in outputs[:8]:
        assert out.finish_reason == "stop"
        assert len(out.text) == 8 and out.text[3] == "-" and out.text.replace("-", "").isdigit()
    assert all(o.text in choices and o.finish_reason == "stop" for o in outputs[8:])


def test_grammar_end_finishes_the_request_even_with_ignore_eos(llm):
    params = sampled(StructuredOutputsParams(choice=["yes", "no"]), 16, ignore_eos=True)
    out = llm.generate(["Is the sky blue? Answer:"], params)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"
    assert len(out.token_ids) <= 3


def test_unconstrained_requests_alongside_are_unchanged(llm):
    greedy = SamplingParams(temperature=0, max_tokens=12)
    alone = llm.generate(["The capital of France is"], greedy)[0].outputs[0].token_ids
    mixed = llm.generate(["The capital of France is", "Pick one:"],
                         [greedy, sampled(StructuredOutputsParams(choice=["a", "b"]), 4)])
    assert mixed[0].outputs[0].token_ids == alone


@pytest.mark.parametrize("constraint, message", [
    (dict(json={"type": "objectx"}), "the JSON schema cannot be used"),
    (dict(regex="(ab"), "the regex cannot be used"),
    (dict(grammar="root ::= missing_rule"), "the grammar cannot be used"),
    # a character no token of the vocabulary spells: every sample would be refused
    (dict(regex="\U00040000"), "no token of the model's vocabulary can begin it"),
])
def test_bad_constraints_are_refused_and_the_engine_goes_on(llm, constraint, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(**constraint)))
    assert llm.generate(["Hello"], SamplingParams(max_tokens=2))[0].outputs[0].token_ids


def test_a_constraint_no_token_can_continue_fails_its_request_alone(llm):
    """"0" then a character no token spells: the first token is sampled, then none may
    follow; the request fails naming that (the server answers 400), the other one ends."""
    stuck = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        regex="0\U00040000"))
    outputs = llm.generate(["x", "Hello"], [stuck, SamplingParams(max_tokens=2)])
    assert outputs[0].outputs[0].finish_reason == "error"
    assert outputs[0].error == NO_CONTINUATION
    assert outputs[1].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("fields, message", [
    (dict(), "exactly one"), (dict(regex="a", choice=["a"]), "exactly one"),
    (dict(json="{not json"), "not valid JSON"), (dict(choice=[]), "non-empty list"),
    (dict(choice=["a", 3]), "non-empty strings"), (dict(json=[1]), "JSON schema"),
])
def test_params_are_validated(fields, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**fields)
