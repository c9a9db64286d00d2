"""Speculative decoding under every plan: verification steps of 1 + k tokens a sequence
under TP, SP and PP groups (gloo, one engine of three groups) and under Shift (the policy
sees each step's scheduled tokens, drafts included) give the single-device tokens of the
engine without speculation, also with penalties (each drafted position's history holds
the draft before it, on every rank that samples), and under async scheduling on a TP
group."""
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


def test_async_scheduling_under_tp(model):
    """Async scheduling with speculation on a TP group: drafting sequences wait for their
    tokens, the others decode ahead with placeholders filled on every rank (each samples
    the same tokens; a verification before them sampled 1 + k rows, checked on the ranks):
    the single-device tokens without speculation."""
    from tests.engine.test_spec_decode_async import StepSpy
    path, reference, _ = model
    options = dict(layout="tp2", async_scheduling=True, check_step_state=True,
                   speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    skip_unless_enough_gpus(options)
    llm = LLM(path, **{**COMMON, **options})
    try:
        spy = StepSpy(llm)
        outputs = llm.generate(PROMPTS * 2, PARAMS)
        assert_same(outputs, reference)
        assert llm.llm_engine.spec_decode_stats().num_accepted_tokens > 0
        assert spy.verifications > 0 and spy.placeholders > 0
        spy.assert_verified_real_tokens(outputs, PROMPTS * 2)
    finally:
        llm.llm_engine.shutdown()
