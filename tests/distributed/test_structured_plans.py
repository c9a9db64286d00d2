"""Structured output under two ranks (gloo, CPU): the engine's token masks reach the
rank that samples, whichever it is. Under PP=2 only the last stage samples; under
DP=2 each replica's ranks get their own requests' masks."""
import json

import jsonschema
import pytest

from parashift import LLM, SamplingParams
from parashift.structured import StructuredOutputsParams

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]


def params(seed: int | None, temperature: float) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=40,
                          structured_outputs=StructuredOutputsParams(json=PERSON))


@pytest.fixture(scope="module")
def greedy_reference():
    with LLM(device="cpu", dtype="float32") as llm:
        return llm.chat([ASK], params(None, 0))[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def dp2():
    """One DP=2 engine for both of its tests."""
    with LLM(device="cpu", dtype="float32", data_parallel_size=2) as llm:
        yield llm


def assert_nine_requests_follow_the_schema(llm, greedy_reference):
    outputs = llm.chat([ASK] * 9, [params(None, 0)] + [params(i, 1.0) for i in range(8)])
    assert outputs[0].outputs[0].token_ids == greedy_reference
    for out in outputs:
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), PERSON)


def test_pp2_follows_the_schema(greedy_reference):
    with LLM(device="cpu", dtype="float32", pipeline_parallel_size=2) as llm:
        assert_nine_requests_follow_the_schema(llm, greedy_reference)


def test_dp2_follows_the_schema(dp2, greedy_reference):
    assert_nine_requests_follow_the_schema(dp2, greedy_reference)


def test_greedy_requests_alone_follow_the_schema(dp2, greedy_reference):
    """A step whose rows are all greedy still applies the masks: the ranks' parameters come
    without the grammar (the step message carries masks), so they must not take the plain
    argmax for such a step (the soak's 500s "the sampled token ... does not follow")."""
    outputs = dp2.chat([ASK] * 2, params(None, 0))
    for out in outputs:
        assert out.outputs[0].token_ids == greedy_reference
        jsonschema.validate(json.loads(out.outputs[0].text), PERSON)
