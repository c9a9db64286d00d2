"""Speculative decoding under every plan: verification steps of 1 + k tokens a sequence
under TP, SP and PP groups (gloo, one engine of three groups) and under Shift (the policy
sees each step's scheduled tokens, drafts included) give the single-device tokens of the
engine without speculation, also with penalties (each drafted position's history holds
the draft before it, on every rank that samples)."""
import json

import pytest

from parashift import LLM, SamplingParams
from tests.distributed.test_plans import COMMON, assert_same, skip_unless_enough_gpus
from tests.engine.conftest import save_tiny_llama
from tests.engine.test_spec_decode import PENALTIES, PROMPTS

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
PENALIZED = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2,
                           **PENALTIES)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny model (its outputs repeat: drafts are accepted) and its single-device
    output without speculation (plain, then penalized)."""
    path = save_tiny_llama(tmp_path_factory.mktemp("spec_plans"))
    llm = LLM(path, **COMMON)
    reference = llm.generate(PROMPTS * 2, PARAMS)
    penalized = llm.generate(PROMPTS * 2, PENALIZED)
    llm.llm_engine.shutdown()
    return path, reference, penalized


def run(path, params=(PARAMS,), **options):
    skip_unless_enough_gpus(options)
    llm = LLM(path, **{**COMMON, **options})
    try:
        outputs = [llm.generate(PROMPTS * 2, p) for p in params]
        return (outputs if len(params) > 1 else outputs[0]), llm.llm_engine.spec_decode_stats()
    finally:
        llm.llm_engine.shutdown()


def test_tp_sp_and_pp_groups_with_and_without_penalties(model):
    path, reference, penalized = model
    (outputs, penalized_outputs), stats = run(
        path, (PARAMS, PENALIZED), layout="tp2,sp2,pp2",
        speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert_same(outputs, reference)
    assert_same(penalized_outputs, penalized)
    assert stats.num_accepted_tokens > 0


def test_shift_sees_the_verification_tokens(model, tmp_path):
    path, reference, _ = model
    timeline = tmp_path / "timeline.jsonl"
    outputs, stats = run(path, parallel_policy="shift", sequence_parallel_size=2,
                         shift_threshold=12, timeline_file=str(timeline),
                         speculative_config={"method": "suffix", "num_speculative_tokens": 4})
    assert_same(outputs, reference)
    assert stats.num_accepted_tokens > 0
    steps = [json.loads(line) for line in open(timeline)]
    assert {step["plan"] for step in steps} == {"sp2", "shift-tp2"}
    for step in steps:  # the scheduled tokens, drafts included, decide the plan
        assert (step["plan"] == "shift-tp2") == (step["num_tokens"] <= 12)
    # some step of few sequences carried drafts: more tokens than sequences
    assert any(step["num_tokens"] > len(PROMPTS) * 2 for step in steps
               if step["plan"] == "shift-tp2")
