"""Deterministic mode across plans: every static plan, and Shift's switches between SP=2
and TP=2, give bit-identical tokens and logprobs to one device (gloo, one process per rank),
greedy and seeded sampling alike."""
import random

import pytest

from parashift import LLM
from parashift.engine.policy import ScriptedPolicy
from tests.deterministic.test_batch_invariance import DEVICE, assert_identical, requests
from tests.distributed.test_plans import skip_unless_enough_gpus
from tests.engine.conftest import save_tiny_llama

COMMON = dict(device=DEVICE, skip_tokenizer_init=True, num_blocks=128, deterministic=True,
              max_num_batched_tokens=48, enable_prefix_caching=False)
MODELS = {"gqa8x4": (8, 4), "gqa6x3": (6, 3)}
PLANS = [("gqa8x4", dict(tensor_parallel_size=2)), ("gqa8x4", dict(sequence_parallel_size=2)),
         ("gqa8x4", dict(pipeline_parallel_size=2)), ("gqa8x4", dict(data_parallel_size=2)),
         ("gqa8x4", dict(sequence_parallel_size=2, tensor_parallel_size=2)),
         ("gqa6x3", dict(tensor_parallel_size=3))]
DTYPES = ("float32", "bfloat16")
# Every plan in fp32; in bf16 the plans that add or exchange across ranks (each start costs
# ~15 s of worker start-up on CI's cores; PP and DP add nothing across ranks, and the batch
# invariance they rely on is tested in bf16 in test_batch_invariance.py).
CASES = [(name, plan, dtype) for dtype in DTYPES for name, plan in PLANS
         if dtype == "float32" or not {"pipeline_parallel_size", "data_parallel_size"} & set(plan)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {name: save_tiny_llama(tmp_path_factory.mktemp(name), num_attention_heads=heads,
                                  num_key_value_heads=kv, hidden_size=96, intermediate_size=192,
                                  num_hidden_layers=3)
            for name, (heads, kv) in MODELS.items()}


def run(model_dir, dtype, policy=None, **plan):
    skip_unless_enough_gpus(plan)
    llm = LLM(model_dir, dtype=dtype, **{**COMMON, **plan})
    try:
        if policy is not None:
            llm.llm_engine.set_policy(policy(llm.llm_engine.policy_plans))
        return llm.generate(*requests(8))
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def references(model_dirs):
    return {(name, dtype): run(d, dtype) for name, d in model_dirs.items() for dtype in DTYPES}


@pytest.mark.parametrize("name, plan, dtype", CASES, ids=[
    "-".join([*(f"{k[0]}p{v}" for k, v in p.items()), d]) for _, p, d in CASES])
def test_plan_gives_single_device_logprobs(model_dirs, references, name, plan, dtype):
    assert_identical(run(model_dirs[name], dtype, **plan), references[(name, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_tp2_halves_gathered_give_single_device_logprobs(model_dirs, references,
                                                        monkeypatch, dtype):
    """PARASHIFT_DETERMINISTIC_TP_SUM=gather: TP=2's two halves gathered and added in order
    instead of added by the all-reduce (on CUDA: the pair exchange), the default."""
    monkeypatch.setenv("PARASHIFT_DETERMINISTIC_TP_SUM", "gather")
    assert_identical(run(model_dirs["gqa8x4"], dtype, tensor_parallel_size=2),
                     references[("gqa8x4", dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_switches_give_single_device_logprobs(model_dirs, references, dtype):
    """Shift over 2 ranks, each step on SP=2 or on TP=2 over SP_TP at random."""
    rng = random.Random(0)

    def random_switches(plans):
        return ScriptedPolicy(plans, lambda group: rng.choice(plans))
    outputs = run(model_dirs["gqa8x4"], dtype, random_switches, sequence_parallel_size=2,
                  parallel_policy="shift")
    assert_identical(outputs, references[("gqa8x4", dtype)])
