"""Every rank's persistent step state against a from-scratch rebuild each step
(`check_step_state`), under random traffic, with Shift switching SP=2 and TP=2 at random:
SP slices of the rows, placeholders on the rank that holds them, two plans' steps."""
import random

from parashift import LLM
from parashift.engine.policy import ScriptedPolicy
from tests.distributed.test_plans import COMMON
from tests.worker.test_step_state import random_traffic


def test_ranks_persistent_state_equals_a_rebuild_under_shift(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, **{**COMMON, "sequence_parallel_size": 2,
                                 "parallel_policy": "shift", "async_scheduling": True,
                                 "check_step_state": True, "num_blocks": 40, "block_size": 8,
                                 "max_num_seqs": 12, "max_model_len": 160})
    try:
        engine = llm.llm_engine
        plans, rng = engine.policy_plans, random.Random(0)
        engine.set_policy(ScriptedPolicy(plans, lambda group: rng.choice(plans)))
        seen = random_traffic(engine, 150, seed=2)
    finally:
        llm.llm_engine.shutdown()
    assert seen["finished"] > 20 and seen["aborted"] > 2 and seen["preempted"] > 0
