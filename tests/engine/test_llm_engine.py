"""End-to-end engine behaviour: every way of batching and caching a request gives
the same greedy tokens; sampling, stops and bad input behave as documented."""
import random

import pytest

from parashift import SamplingParams
from tests.engine.conftest import tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def random_prompts(n: int, seed: int = 0, vocab: int = 512, lengths=(3, 90)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """Each prompt alone, whole-prompt prefill, no prefix cache, one step at a time."""
    llm = tiny_llm(tiny_llama_dir, enable_prefix_caching=False, async_scheduling=False)
    prompts = random_prompts(17)
    return prompts, [token_ids(llm.generate([p], GREEDY))[0] for p in prompts]


def test_batch_invariance(tiny_llama_dir, reference):
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir)
    assert token_ids(llm.generate(prompts, GREEDY)) == expected


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_every_chunk_size_gives_identical_output(tiny_llama_dir, reference, chunk):
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir, max_num_batched_tokens=chunk, enable_prefix_caching=False)
    assert token_ids(llm.generate(prompts[:6], GREEDY)) == expected[:6]


def test_preemption_under_tiny_pool_gives_identical_output(tiny_llama_dir, reference):
    prompts, expected = reference
    # 512 tokens of KV for 17 sequences of up to 114 tokens: preemption is certain
    llm = tiny_llm(tiny_llama_dir, num_blocks=32, max_model_len=512)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.llm_engine.stats().num_preemptions > 0
    assert token_ids(outputs) == expected
    assert llm.llm_engine.block_manager.num_free_blocks == 32


def test_prefix_cache_hit_gives_identical_output(tiny_llama_dir, reference):
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir)
    shared = prompts[0] * 3  # 3+ full blocks
    first = llm.generate([shared + [1, 2, 3]], GREEDY)
    second = llm.generate([shared + [1, 2, 3]], GREEDY)
    assert second[0].num_cached_tokens >= 16 * (len(shared) // 16)
    assert token_ids(first) == token_ids(second)
    assert token_ids(llm.generate(prompts, GREEDY)) == expected  # a reused pool changes nothing


def test_seeded_sampling_is_reproducible_across_runs_and_batches(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir)
    prompts = random_prompts(8, seed=1)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = token_ids(llm.generate([prompts[0]], seeded))
    again = token_ids(llm.generate([prompts[0]], seeded))
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    mixed = llm.generate(prompts, [seeded] + [unseeded] * 7)
    assert alone == again == token_ids(mixed)[:1]
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    assert token_ids(llm.generate([prompts[0]], other_seed)) != alone


def test_engine_seed_makes_unseeded_sampling_reproducible(tiny_llama_dir):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    prompts = random_prompts(4, seed=2)
    first = token_ids(tiny_llm(tiny_llama_dir, seed=7).generate(prompts, params))
    second = token_ids(tiny_llm(tiny_llama_dir, seed=7).generate(prompts, params))
    assert first == second


def test_finish_reasons_and_stop_token_ids(tiny_llama_dir, reference):
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir)
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 5
    stop_id = expected[0][3]
    first_hit = expected[0].index(stop_id)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_id])
    out = llm.generate([prompts[0]], params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.token_ids == expected[0][:first_hit + 1]


def test_logprobs_hold_sampled_token_and_top_k(tiny_llama_dir, reference):
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    out = llm.generate([prompts[0]], params)[0].outputs[0]
    assert len(out.logprobs) == 6
    for token, logprobs in zip(out.token_ids, out.logprobs):
        assert token in logprobs and len(logprobs) == 3  # greedy: the sampled token is the top one
        assert max(logprobs, key=logprobs.get) == token
        assert all(v <= 0 for v in logprobs.values())


def test_priority_orders_admission(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, max_num_seqs=1)
    prompts = random_prompts(3, seed=3)
    engine = llm.llm_engine
    for i, prio in enumerate([5, 0, 1]):
        engine.add_request(f"r{i}", prompts[i], SamplingParams(temperature=0, max_tokens=2), prio)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["r1", "r2", "r0"]


def test_placement_names_each_placed_requests_ranks(tiny_llama_dir):
    engine = tiny_llm(tiny_llama_dir).llm_engine
    for i in range(2):
        engine.add_request(f"p{i}", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2))
    assert engine.placement() == {"p0": (0,), "p1": (0,)}
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.placement() == {}
    assert engine.worker_pids() == []  # one device: no worker process


def test_smollm2_answers_and_stop_strings(smollm2):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    out = smollm2.chat(question, SamplingParams(temperature=0, max_tokens=32))[0].outputs[0]
    assert out.text == "The capital of France is Paris." and out.finish_reason == "stop"
    out = smollm2.chat(question, SamplingParams(temperature=0, max_tokens=32, stop=[" is"]))[0]
    assert out.outputs[0].text == "The capital of France"
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == " is"


def test_smollm2_batch_invariance(smollm2):
    texts = ["The capital of France is", "Water boils at", "def fibonacci(n):",
             "Once upon a time", "The three primary colors are"] * 4
    texts = [t + " " * (i % 3) for i, t in enumerate(texts)][:17]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = smollm2.generate(texts[:1], params)
    together = smollm2.generate(texts, params)
    assert alone[0].outputs[0].token_ids == together[0].outputs[0].token_ids


def test_every_step_is_recorded_with_its_plan_and_tokens(tiny_llama_dir, tmp_path):
    import json
    timeline = tmp_path / "timeline.jsonl"
    llm = tiny_llm(tiny_llama_dir, timeline_file=str(timeline), max_num_batched_tokens=16)
    prompts = random_prompts(3, seed=4)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    records = llm.llm_engine.take_step_records()
    assert llm.llm_engine.take_step_records() == []  # taken once
    # every prompt token once, and every generated token but the last fed back once
    assert sum(r.num_tokens for r in records) == sum(map(len, prompts)) + 3 * 4
    assert {r.plan for r in records} == {"single"} and all(r.seconds > 0 for r in records)
    llm.llm_engine.shutdown()
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert [line["num_tokens"] for line in lines] == [r.num_tokens for r in records]


def test_padded_steps_give_identical_output(tiny_llama_dir, reference, monkeypatch):
    """Steps padded to a larger batch (as CUDA graphs run them) change nothing."""
    import parashift.worker.model_runner as model_runner
    prompts, expected = reference
    build = model_runner.build_step_inputs
    monkeypatch.setattr(model_runner, "build_step_inputs",
                        lambda chunks, *args, **kw: build(chunks, *args, **kw,
                                                          pad_to=len(chunks) + 3))
    llm = tiny_llm(tiny_llama_dir)
    assert token_ids(llm.generate(prompts[:5], GREEDY)) == expected[:5]


def test_cuda_graphs_default_to_off_where_impossible(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir)
    assert llm.llm_engine.config.cuda_graphs is None and llm.llm_engine.runner.graphs is None


def test_a_long_prompt_leaves_room_for_the_requests_behind_it(tiny_llama_dir):
    """Head-of-line blocking is bounded by one step: with a budget of 64 tokens a long
    prompt takes at most half of each step (the default cap), so a 2-token request added
    after it gets its first token in its first step, long before the prompt's prefill ends.
    (Inline outputs: a threaded output processor may report that token a step or two later.)"""
    llm = tiny_llm(tiny_llama_dir, max_num_batched_tokens=64, max_model_len=512,
                   output_processor="inline")
    engine = llm.llm_engine
    assert engine.config.long_prefill_token_threshold == 32
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.add_request("long", list(range(1, 401)), params)
    engine.step()  # the long prompt starts
    engine.add_request("short", [5, 6], params)
    steps_to_short = steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        outputs = {o.request_id: o for o in engine.step()}
        if "short" in outputs and not steps_to_short:
            steps_to_short = steps
    assert steps_to_short <= 2 and steps >= 12  # the long prompt needs 400 / 32 steps


def test_step_budget_defaults_by_device(tiny_llama_dir):
    engine = tiny_llm(tiny_llama_dir).llm_engine  # the offline LLM on the CPU
    assert (engine.config.max_num_batched_tokens, engine.config.long_prefill_token_threshold) \
        == (2048, 1024)
    engine = tiny_llm(tiny_llama_dir, long_prefill_token_threshold=0).llm_engine
    assert engine.config.long_prefill_token_threshold == 0  # no cap, as asked


def test_a_final_only_request_makes_one_output_and_generate_asks_for_it(tiny_llama_dir):
    """vLLM's FINAL_ONLY: no per-step outputs (their objects cost ~3 µs per sequence and
    step at 1024 sequences); the last one equals a cumulative request's last one."""
    llm = tiny_llm(tiny_llama_dir)
    engine = llm.llm_engine
    prompt = [5, 6, 7, 8]
    for request_id, kind in (("c", "cumulative"), ("f", "final_only")):
        engine.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=6,
                                                              ignore_eos=True, output_kind=kind))
    seen = {"c": [], "f": []}
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen[output.request_id].append(output)
    assert len(seen["c"]) == 6 and len(seen["f"]) == 1 and seen["f"][0].finished
    assert seen["f"][0].outputs[0].token_ids == seen["c"][-1].outputs[0].token_ids
    generated = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True))
    assert generated[0].outputs[0].token_ids == seen["c"][-1].outputs[0].token_ids
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="streaming")


def test_a_cas_round_pads_to_its_longest_decode_only_where_every_replica_decodes():
    from types import SimpleNamespace

    from parashift.engine.llm_engine import decode_round_rows

    def sched(tokens_per_seq: list[int], swaps: list = ()):
        return SimpleNamespace(num_chunks=len(tokens_per_seq),
                               num_batched_tokens=sum(tokens_per_seq),
                               swap_out=list(swaps), swap_in=[])
    assert decode_round_rows([sched([1, 1, 1]), sched([1]), sched([])]) == 3
    assert decode_round_rows([sched([1, 1]), sched([5, 1])]) == 0  # a prompt's chunk
    assert decode_round_rows([sched([1, 1]), sched([1], swaps=["out"])]) == 0


def test_without_chunked_prefill_prompts_prefill_whole_with_the_same_tokens(tiny_llama_dir,
                                                                            reference):
    """vLLM's --no-enable-chunked-prefill: the step budget holds max_model_len, no cap; the
    greedy tokens are the reference's. max_logprobs bounds a request's logprobs."""
    prompts, expected = reference
    llm = tiny_llm(tiny_llama_dir, enable_chunked_prefill=False, max_model_len=128,
                   enable_prefix_caching=False, max_logprobs=2)
    config = llm.llm_engine.config
    assert config.max_num_batched_tokens >= 128 and config.long_prefill_token_threshold == 0
    assert token_ids(llm.generate(prompts[:6], GREEDY)) == expected[:6]
    with pytest.raises(ValueError, match="logprobs 3 is more than this engine's max_logprobs"):
        llm.generate([prompts[0]], SamplingParams(max_tokens=2, logprobs=3))
    assert llm.generate([prompts[0]], SamplingParams(max_tokens=2, logprobs=2))
