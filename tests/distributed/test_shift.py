"""Shift Parallelism: steps switch between the base (SP, TP) plan and full TP over
SP_TP, over one KV cache, and every switch schedule gives the single-device tokens."""
import json
import random

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.policy import ScriptedPolicy
from tests.distributed.test_plans import (DEVICE, GRAPHS, assert_same, plan_id, prompts,
                                          skip_unless_enough_gpus)
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
COMMON = dict(device=DEVICE, dtype="float32", skip_tokenizer_init=True, num_blocks=96,
              max_num_batched_tokens=40, parallel_policy="shift", cuda_graphs=GRAPHS)
MODELS = {"gqa8x2": (8, 2), "gqa6x3": (6, 3), "gqa8x4": (8, 4)}
# under the default `reorder` weights: gqa8x2 under SP=2 and gqa6x3 under SP=3 reorder every
# layer; gqa8x2 under SP=4 or under TP=2 SP=2 has fewer KV heads per TP rank than SP ranks (its
# QKV keeps slice views); gqa8x4 under TP=2 SP=2 reorders TP shards
CASES = [("gqa8x2", dict(sequence_parallel_size=2)), ("gqa6x3", dict(sequence_parallel_size=3)),
         ("gqa8x2", dict(sequence_parallel_size=4)),
         ("gqa8x2", dict(sequence_parallel_size=2, tensor_parallel_size=2)),
         ("gqa8x4", dict(sequence_parallel_size=2, tensor_parallel_size=2))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    dirs = {name: save_tiny_llama(tmp_path_factory.mktemp(name), num_attention_heads=heads,
                                  num_key_value_heads=kv, hidden_size=96, intermediate_size=192,
                                  num_hidden_layers=3)
            for name, (heads, kv) in MODELS.items()}
    refs = {}
    for name, d in dirs.items():
        llm = LLM(d, **{**COMMON, "parallel_policy": "static"})
        refs[name] = llm.generate(prompts(), PARAMS)
    return dirs, refs


def shift_llm(model_dir, tmp_path=None, **options):
    skip_unless_enough_gpus(options)
    timeline = str(tmp_path / "timeline.jsonl") if tmp_path else None
    return LLM(model_dir, **{**COMMON, "timeline_file": timeline, **options})


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n}-{plan_id(p)}" for n, p in CASES])
def test_random_switch_schedules_match_single_device(models, name, plan):
    dirs, refs = models
    llm = shift_llm(dirs[name], **plan)
    try:
        plans = llm.llm_engine.policy_plans
        for seed in range(2):
            rng = random.Random(seed)
            llm.llm_engine.set_policy(ScriptedPolicy(plans, lambda group: rng.choice(plans)))
            assert_same(llm.generate(prompts(), PARAMS), refs[name])
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("weights", ["reorder", "separate", "slice"])
def test_threshold_switching_uses_both_plans(models, tmp_path, weights):
    dirs, refs = models
    llm = shift_llm(dirs["gqa8x2"], tmp_path, sequence_parallel_size=2, shift_threshold=8,
                    shift_weights=weights)
    try:
        assert_same(llm.generate(prompts(), PARAMS), refs["gqa8x2"])
    finally:
        llm.llm_engine.shutdown()
    steps = [json.loads(line) for line in open(tmp_path / "timeline.jsonl")]
    by_plan = {step["plan"] for step in steps}
    assert by_plan == {"sp2", "shift-tp2"}
    for step in steps:  # the threshold decides, step by step
        assert (step["plan"] == "shift-tp2") == (step["num_tokens"] <= 8)
        assert step["seconds"] > 0


def test_shift_policy_needs_sequence_parallelism(models):
    dirs, _ = models
    with pytest.raises(ValueError, match="sequence_parallel_size >= 2"):
        shift_llm(dirs["gqa8x2"], tensor_parallel_size=2)
