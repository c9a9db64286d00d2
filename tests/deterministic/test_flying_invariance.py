"""Deterministic mode across Flying Serving's merges and splits: two replicas that merge
into one TP=2 group and split again, over and over with requests in flight, give the
single device's tokens and logprobs bit for bit, under each weight layout of a merge."""
import pytest

from parashift import LLM
from parashift.parallel.layout import Layout
from tests.deterministic.test_batch_invariance import assert_identical, requests
from tests.deterministic.test_plan_invariance import COMMON, run
from tests.distributed.test_plans import skip_unless_enough_gpus
from tests.engine.conftest import save_tiny_llama
from tests.helpers.policies import LayoutCycle


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("flying-det"), num_attention_heads=8,
                           num_key_value_heads=4, hidden_size=96, intermediate_size=192,
                           num_hidden_layers=3)


@pytest.fixture(scope="module")
def reference(model_dir):
    return run(model_dir, "float32")


CASES = [  # (starting layout, layouts cycled through, merge weight layout)
    ("single,single", ["merge2-tp2", "single,single"], "reorder"),
    ("single,single", ["merge2-tp2", "single,single"], "view"),
    ("single,single", ["merge2-tp2", "single,single"], "materialize"),
    ("single,single,single,single", ["merge2-tp2,merge2-tp2", "merge4-tp4",
                                     "merge2-tp2,merge2-tp2", "single,single,single,single"],
     "reorder"),
]


@pytest.mark.parametrize("start, cycle, mode", CASES,
                         ids=["w1-2-reorder", "w1-2-view", "w1-2-materialize", "w1-2-4-reorder"])
def test_merges_and_splits_give_single_device_logprobs(model_dir, reference, start, cycle,
                                                       mode):
    skip_unless_enough_gpus(dict(layout=start))
    llm = LLM(model_dir, dtype="float32", **{**COMMON, "layout": start,
                                             "parallel_policy": "flying", "merge_weights": mode})
    engine = llm.llm_engine
    try:
        engine.set_policy(LayoutCycle(engine, [Layout.parse(spec) for spec in cycle], every=2,
                                      limit=6))
        outputs = llm.generate(*requests(8))
        kinds = [r.kind for r in engine.take_transition_records()]
    finally:
        engine.shutdown()
    # the cycle's first moves, as far as the requests lasted (on two busy cores they may
    # finish before the policy asks for all of them)
    first = ["merge", "split"] if len(cycle) == 2 else ["merge"] * 3
    assert kinds and kinds[:len(first)] == first[:len(kinds)]
    assert_identical(outputs, reference)
