"""Async scheduling across ranks: every rank of a one-stage plan samples the same
tokens and fills the next step's placeholders from them; the tokens equal the
single-device ones, under static plans and under Shift's plan switches."""
import random

import pytest

from tests.distributed.test_plans import COMMON, PARAMS, assert_same, generate, prompts
from tests.engine.conftest import save_tiny_llama
from tests.engine.test_async_scheduling import spy_on_steps
from parashift import LLM, SamplingParams
from parashift.engine.policy import ScriptedPolicy


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = save_tiny_llama(tmp_path_factory.mktemp("gqa8x2"), num_attention_heads=8,
                        num_key_value_heads=2, hidden_size=96, intermediate_size=192,
                        num_hidden_layers=3)
    reference, _ = generate(d, prompts(), async_scheduling=False)
    return d, reference


def assert_one_devices_tokens_with_steps_in_flight(llm, reference) -> None:
    seen = spy_on_steps(llm)
    plans = llm.llm_engine.policy_plans
    if len(plans) > 1 and len(llm.llm_engine.layout.plans) == 1:  # shift: switch at random
        rng = random.Random(0)
        llm.llm_engine.set_policy(ScriptedPolicy(plans, lambda group: rng.choice(plans)))
    assert_same(llm.generate(prompts(), PARAMS), reference)
    assert seen["overlapped"] > 0 and seen["placeholders"] > 0


@pytest.mark.parametrize("plan", [dict(sequence_parallel_size=2),
                                  dict(sequence_parallel_size=2, parallel_policy="shift"),
                                  dict(data_parallel_size=2)],
                         ids=["sp2", "shift-sp2", "dp2"])  # tp2: the test below
def test_async_plans_match_single_device(model, plan):
    model_dir, reference = model
    llm = LLM(model_dir, **{**COMMON, **plan, "async_scheduling": True})
    try:
        assert_one_devices_tokens_with_steps_in_flight(llm, reference)
    finally:
        llm.llm_engine.shutdown()


def test_tp2_greedy_then_seeded_sampling_agree_across_ranks(model):
    """TP=2's greedy tokens as above; then, on the same engine, non-greedy rows: each rank
    draws the same noise, so placeholders hold the token the output rank reported; the
    result equals one device's."""
    model_dir, reference = model
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=10, ignore_eos=True)
    single = LLM(model_dir, **{**COMMON, "async_scheduling": False})
    try:
        seeded_reference = single.generate(prompts(), params)
    finally:
        single.llm_engine.shutdown()
    llm = LLM(model_dir, **{**COMMON, "tensor_parallel_size": 2, "async_scheduling": True})
    try:
        assert_one_devices_tokens_with_steps_in_flight(llm, reference)
        got = llm.generate(prompts(), params)
    finally:
        llm.llm_engine.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [
        o.outputs[0].token_ids for o in seeded_reference]
