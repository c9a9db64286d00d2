"""Swap preemption on several ranks (gloo, one process per rank): each rank swaps its slice
of a preempted request's KV (its heads under TP, its stage's layers under PP, its
replica's requests under DP) through its group's CPU tier, and the greedy tokens are
those of one device with an ample pool and of recompute preemption."""
import pytest

from parashift import LLM, SamplingParams
from tests.distributed.test_plans import COMMON, assert_same, plan_id, prompts
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=4)
SMALL_POOL = dict(num_blocks=12, max_model_len=128)  # 192 tokens: preemption is certain


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("gqa8x4"), num_attention_heads=8,
                           num_key_value_heads=4, hidden_size=96, intermediate_size=192,
                           num_hidden_layers=4)


def generate(model_dir, prompt_list, **options):
    llm = LLM(model_dir, **{**COMMON, **options})
    try:
        return llm.generate(prompt_list, PARAMS), llm.llm_engine.stats()
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def references(model_dir):
    """One device: an ample pool, and the small pool preempting by recompute."""
    many = prompts(seed=1, n=10)
    ample, _ = generate(model_dir, many)
    recomputed, stats = generate(model_dir, many, **SMALL_POOL)
    assert stats.num_preemptions > 0 and stats.num_recompute_tokens > 0
    assert_same(recomputed, ample)
    return many, ample


@pytest.mark.parametrize("plan", [dict(tensor_parallel_size=2), dict(data_parallel_size=2),
                                  dict(pipeline_parallel_size=2)], ids=plan_id)
def test_swap_preemption_matches_one_device(model_dir, references, plan):
    many, ample = references
    outputs, stats = generate(model_dir, many, **plan, **SMALL_POOL, preemption_mode="swap",
                              swap_space=0.01)
    assert_same(outputs, ample)
    assert stats.num_swapped_out > 0 and stats.num_swapped_in == stats.num_swapped_out
    assert stats.num_recompute_tokens == 0 and stats.swap_tokens_used == 0
