"""Swap preemption end to end on one device: under a KV pool far too small for its
requests, swap mode gives the greedy tokens of recompute mode and of an ample pool, with
requests swapped out and in and nothing computed again; aborts give slots back."""
import pytest

from parashift import SamplingParams
from tests.engine.conftest import tiny_llm
from tests.engine.test_llm_engine import GREEDY, random_prompts, token_ids

TINY_POOL = dict(num_blocks=32, max_model_len=512)  # 512 tokens for 17 requests of up to 114
TOKEN_BYTES = 2 * 2 * 2 * 16 * 4  # K and V x 2 layers x 2 KV heads x head_dim 16 x float32


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    prompts = random_prompts(17)
    return prompts, token_ids(tiny_llm(tiny_llama_dir).generate(prompts, GREEDY))


def run(model_dir, prompts, **options):
    llm = tiny_llm(model_dir, **TINY_POOL, **options)
    try:
        return token_ids(llm.generate(prompts, GREEDY)), llm.llm_engine.stats()
    finally:
        llm.llm_engine.shutdown()


def test_recompute_mode_drops_computed_tokens(tiny_llama_dir, reference):
    prompts, expected = reference
    tokens, stats = run(tiny_llama_dir, prompts)
    assert tokens == expected
    assert stats.num_preemptions > 0 and stats.num_recompute_tokens > 0
    assert stats.num_swapped_out == stats.swap_bytes_out == 0


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("caching", [True, False])
def test_swap_mode_gives_the_same_tokens_computing_nothing_again(tiny_llama_dir, reference,
                                                                 async_scheduling, caching):
    prompts, expected = reference
    tokens, stats = run(tiny_llama_dir, prompts, preemption_mode="swap", swap_space=0.01,
                        async_scheduling=async_scheduling, enable_prefix_caching=caching)
    assert tokens == expected
    assert stats.num_preemptions == stats.num_swapped_out > 0
    assert stats.num_swapped_in == stats.num_swapped_out
    assert stats.swap_bytes_in == stats.swap_bytes_out > 0
    assert stats.swap_bytes_out % TOKEN_BYTES == 0
    assert stats.num_recompute_tokens == 0 and stats.swap_tokens_used == 0
    assert stats.num_free_blocks == stats.num_total_blocks == 32


def test_a_full_tier_falls_back_to_recompute(tiny_llama_dir, reference):
    prompts, expected = reference
    tokens, stats = run(tiny_llama_dir, prompts, preemption_mode="swap",
                        swap_space=120 * TOKEN_BYTES / 2**30)  # one request's KV at most
    assert tokens == expected
    assert 0 < stats.num_swapped_out < stats.num_preemptions
    assert stats.num_recompute_tokens > 0 and stats.swap_tokens_used == 0


def test_aborting_a_swapped_request_frees_its_slot(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, **TINY_POOL, preemption_mode="swap", swap_space=0.01)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    try:
        for i, prompt in enumerate(random_prompts(17)):
            engine.add_request(str(i), prompt, params)
        while engine.stats().swap_tokens_used == 0:
            engine.step()
        slots = engine.scheduler.swap_slots
        swapped = list(slots.slots)
        for request_id in swapped:
            engine.abort_request(request_id)
        assert not slots.slots.keys() & set(swapped)
        while engine.has_unfinished_requests():
            engine.step()
        stats = engine.stats()
        assert stats.swap_tokens_used == 0 and slots.used_tokens == 0
        assert slots.largest_free() == slots.capacity
        assert stats.num_free_blocks == 32 and stats.num_running == stats.num_waiting == 0
    finally:
        engine.shutdown()
