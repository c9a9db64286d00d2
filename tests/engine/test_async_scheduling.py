"""Async scheduling: the next step is scheduled while one runs, its pending tokens
filled on the device; the tokens are those of one-step-at-a-time scheduling."""
import pytest

from parashift import LLM, SamplingParams
from parashift.engine.scheduler import PLACEHOLDER_TOKEN
from tests.engine.conftest import tiny_llm
from tests.engine.test_llm_engine import random_prompts


def run(llm: LLM, prompts, params) -> list[tuple[list[int], str, list]]:
    outs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].logprobs)
            for o in outs]


def assert_same(got, expected) -> None:
    """Tokens and finish reasons exact; logprobs to float noise (batches differ)."""
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    for (_, _, got_lp), (_, _, want_lp) in zip(got, expected):
        for g, w in zip(got_lp or [], want_lp or []):
            assert g.keys() == w.keys()
            assert max(abs(g[t] - w[t]) for t in g) < 1e-4


def spy_on_steps(llm: LLM) -> dict:
    """Counts steps submitted while another was in flight, and placeholder tokens sent."""
    engine, seen = llm.llm_engine, {"overlapped": 0, "placeholders": 0}
    submit = engine.executor.submit

    def counting_submit(replica, ranks, output_rank, batch):
        seen["overlapped"] += bool(replica.in_flight)
        seen["placeholders"] += sum(PLACEHOLDER_TOKEN in c.token_ids for c in batch.all_chunks())
        submit(replica, ranks, output_rank, batch)
    engine.executor.submit = counting_submit
    return seen


@pytest.mark.parametrize("options", [
    {},
    {"max_num_batched_tokens": 7, "enable_prefix_caching": False},
    {"num_blocks": 32, "max_model_len": 512},  # preemption
])
def test_async_gives_the_tokens_of_one_step_at_a_time(tiny_llama_dir, options):
    prompts = random_prompts(12, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=5 + 3 * i, logprobs=2,
                             ignore_eos=i % 2 == 0, stop_token_ids=[7, 300] if i % 3 else [])
              for i in range(len(prompts))]
    expected = run(tiny_llm(tiny_llama_dir, async_scheduling=False, **options), prompts, params)
    llm = tiny_llm(tiny_llama_dir, async_scheduling=True, **options)
    seen = spy_on_steps(llm)
    assert_same(run(llm, prompts, params), expected)
    assert seen["overlapped"] > 0 and seen["placeholders"] > 0
    engine = llm.llm_engine
    while any(r.in_flight for r in engine.replicas):  # the last overlapped step
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if "num_blocks" in options:
        assert engine.stats().num_preemptions > 0


def test_seeded_sampling_is_the_same_async(tiny_llama_dir):
    prompts = random_prompts(5, seed=4)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True)
    sync = run(tiny_llm(tiny_llama_dir, async_scheduling=False), prompts, params)
    assert run(tiny_llm(tiny_llama_dir, async_scheduling=True), prompts, params) == sync


def test_abort_with_steps_in_flight_frees_everything(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, async_scheduling=True)
    engine = llm.llm_engine
    for i, prompt in enumerate(random_prompts(4, seed=5)):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(6):
        engine.step()
    assert len(engine.replicas[0].in_flight) == 1  # one still running after each step()
    for i in range(4):
        engine.abort_request(str(i))
    while any(r.in_flight for r in engine.replicas):
        assert engine.step() == []  # results of aborted requests are dropped
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_async_is_the_default_except_with_pipeline_parallelism(tiny_llama_dir):
    """(Seesaw's one-stage decode plan keeps two steps in flight beside its pipelined
    prefill plan: tests/distributed/test_seesaw.py.)"""
    assert tiny_llm(tiny_llama_dir).llm_engine.steps_in_flight == 2
    with pytest.raises(ValueError, match="async_scheduling does not work with pipeline"):
        tiny_llm(tiny_llama_dir, async_scheduling=True, pipeline_parallel_size=2)
