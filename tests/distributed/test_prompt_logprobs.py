"""Prompt logprobs under every plan equal the single device's: one engine of a pipeline
group (its steps cut into micro-batches) beside a TP group (two DP replicas), one under
Shift Parallelism switching between SP and TP at random; prompts prefilled in chunks."""
import random

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.policy import ScriptedPolicy
from tests.distributed.test_plans import COMMON, assert_same, prompts, skip_unless_enough_gpus
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2,
                        prompt_logprobs=3)
PROMPTS = prompts(seed=3, n=6)


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    model = save_tiny_llama(tmp_path_factory.mktemp("gqa8x4"), num_attention_heads=8,
                            num_key_value_heads=4, hidden_size=96, intermediate_size=192,
                            num_hidden_layers=4)
    llm = LLM(model, **COMMON)
    try:
        return model, llm.generate(PROMPTS, PARAMS)
    finally:
        llm.llm_engine.shutdown()


def assert_same_prompt_logprobs(outputs, reference):
    assert_same(outputs, reference)
    for out, ref in zip(outputs, reference):
        assert len(out.prompt_logprobs) == len(ref.prompt_logprobs) == len(ref.prompt_token_ids)
        assert out.prompt_logprobs[0] is None
        for token, got, want in zip(ref.prompt_token_ids[1:], out.prompt_logprobs[1:],
                                    ref.prompt_logprobs[1:]):
            assert got[token].logprob == pytest.approx(want[token].logprob, abs=1e-4)
            tops = [sorted(lp.logprob for lp in e.values() if lp.rank <= 3) for e in (got, want)]
            assert tops[0] == pytest.approx(tops[1], abs=1e-4)


@pytest.mark.parametrize("plan", [dict(layout="pp2,tp2"),
                                  dict(parallel_policy="shift", sequence_parallel_size=2)],
                         ids=["pp2-beside-tp2", "shift-sp2"])
def test_prompt_logprobs_match_single_device(model_and_reference, plan):
    skip_unless_enough_gpus(plan)
    model, reference = model_and_reference
    llm = LLM(model, **{**COMMON, **plan})
    try:
        if plan.get("parallel_policy") == "shift":
            plans, rng = llm.llm_engine.policy_plans, random.Random(0)
            llm.llm_engine.set_policy(ScriptedPolicy(plans, lambda group: rng.choice(plans)))
        assert_same_prompt_logprobs(llm.generate(PROMPTS, PARAMS), reference)
    finally:
        llm.llm_engine.shutdown()
