"""Every static plan computes the same function as one device: multi-process
gloo groups on the CPU, one process per rank."""
import os
import random

import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.config import EngineConfig
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=4)
DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")  # "cuda": NCCL on the GPU machine
GRAPHS = os.environ.get("PARASHIFT_TEST_CUDA_GRAPHS") == "1"  # GPU machine: decode as graphs
# a small token budget: prefill chunks mixed with decodes, a pipeline's steps of 16 tokens
# or more in micro-batches (prompts cut across them); with GRAPHS, graphs wherever the plan
# allows them by default (pipelined plans' stages too), else none
COMMON = dict(device=DEVICE, dtype="float32", skip_tokenizer_init=True, num_blocks=96,
              max_num_batched_tokens=40, pp_micro_batch_tokens=8,
              cuda_graphs=None if GRAPHS else False)


def prompts(seed=0, n=5, vocab=512):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 70))] for _ in range(n)]


def skip_unless_enough_gpus(plan: dict) -> None:
    world = EngineConfig(**plan).node_layout.world_size
    if DEVICE == "cuda" and world > torch.cuda.device_count():
        pytest.skip(f"{world} ranks need {world} GPUs (NCCL takes one rank per GPU)")


def generate(model_dir, prompt_list, **plan):
    skip_unless_enough_gpus(plan)
    llm = LLM(model_dir, **{**COMMON, **plan})
    try:
        return llm.generate(prompt_list, PARAMS), llm.llm_engine.stats()
    finally:
        llm.llm_engine.shutdown()


def assert_same(outputs, reference, logprob_tolerance: float = 1e-4):
    for out, ref in zip(outputs, reference):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        for got, want in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert got.keys() == want.keys()
            assert max(abs(got[t] - want[t]) for t in got) < logprob_tolerance


MODELS = {  # name -> (heads, kv heads, plans)
    # PP=2 and `tp2,single` are checked against the reference by the tests of their own
    # below (test_pipeline_keeps_a_step_in_flight_per_stage, test_each_group_sizes_its_own_kv_pool)
    "gqa8x4": (8, 4, [dict(tensor_parallel_size=2), dict(sequence_parallel_size=2),
                      dict(data_parallel_size=2),
                      dict(tensor_parallel_size=4), dict(sequence_parallel_size=4),
                      dict(data_parallel_size=3), dict(pipeline_parallel_size=3),
                      dict(data_parallel_size=4), dict(pipeline_parallel_size=4),
                      dict(sequence_parallel_size=2, tensor_parallel_size=2),
                      dict(data_parallel_size=2, tensor_parallel_size=2),
                      dict(pipeline_parallel_size=2, tensor_parallel_size=2),
                      # node layouts whose groups run different plans
                      dict(layout="tp2,single,single"),
                      dict(layout="sp2,tp2"), dict(layout="single,pp2,single"),
                      # the engine core (and its ranks, forked from its own fork server) in
                      # a process of its own: a pipeline, whose stages keep steps in flight
                      # (one plan only: the core's start imports torch twice, ~10 s on CI)
                      dict(pipeline_parallel_size=2, engine_core_process=True)]),
    # fewer KV heads than SP (and TP) ranks: KV heads are replicated
    "gqa8x2": (8, 2, [dict(sequence_parallel_size=4), dict(tensor_parallel_size=4),
                      dict(sequence_parallel_size=2, tensor_parallel_size=2)]),
    "gqa6x3": (6, 3, [dict(tensor_parallel_size=3), dict(sequence_parallel_size=3),
                      dict(layout="tp3,single")]),
}
CASES = [(name, plan) for name, (_, _, plans) in MODELS.items() for plan in plans]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for name, (heads, kv_heads, _) in MODELS.items():
        dirs[name] = save_tiny_llama(tmp_path_factory.mktemp(name), num_attention_heads=heads,
                                     num_key_value_heads=kv_heads, hidden_size=96, intermediate_size=192,
                                     num_hidden_layers=4)
    return dirs


@pytest.fixture(scope="module")
def references(model_dirs):
    return {name: generate(d, prompts())[0] for name, d in model_dirs.items()}


def plan_id(plan: dict) -> str:
    return "-".join(f"{key.split('_')[0][0]}p{value}" for key, value in plan.items())


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n}-{plan_id(p)}" for n, p in CASES])
def test_plan_matches_single_device(model_dirs, references, name, plan):
    outputs, _ = generate(model_dirs[name], prompts(), **plan)
    assert_same(outputs, references[name])


SINGLE, MANY = [[5]], prompts(seed=1, n=6)


@pytest.fixture(scope="module")
def single_and_many_references(model_dirs):
    return [generate(model_dirs["gqa8x4"], prompt_list)[0] for prompt_list in (SINGLE, MANY)]


@pytest.mark.parametrize("plan", [dict(sequence_parallel_size=4),
                                  dict(pipeline_parallel_size=2, tensor_parallel_size=2)], ids=plan_id)
def test_single_token_steps_and_preemption(model_dirs, single_and_many_references, plan):
    """One sequence decoding alone gives steps with fewer tokens than SP ranks;
    a pool of 12 blocks forces preemption of the longer batch (one engine for both)."""
    skip_unless_enough_gpus(plan)
    llm = LLM(model_dirs["gqa8x4"], **{**COMMON, **plan, "num_blocks": 12, "max_model_len": 128})
    try:
        single = llm.generate(SINGLE, PARAMS)
        many = llm.generate(MANY, PARAMS)
        assert llm.llm_engine.stats().num_preemptions > 0
    finally:
        llm.llm_engine.shutdown()
    assert_same(single, single_and_many_references[0])
    assert_same(many, single_and_many_references[1])


def test_pipeline_keeps_a_step_in_flight_per_stage(model_dirs, references):
    """PP=2 serves two replicas on disjoint halves of the KV pool, so stage 0 runs one
    replica's step while stage 1 runs the other's."""
    llm = LLM(model_dirs["gqa8x4"], **{**COMMON, "pipeline_parallel_size": 2})
    engine, executor = llm.llm_engine, llm.llm_engine.executor
    try:
        assert [(r.encoder.block_offset, r.block_manager.num_blocks)
                for r in engine.replicas] == [(0, 48), (48, 48)]
        most_in_flight, submit = 0, executor.submit

        def counting_submit(*args):
            nonlocal most_in_flight
            submit(*args)
            most_in_flight = max(most_in_flight, sum(len(queue) for queue in executor.pending))
        executor.submit = counting_submit
        assert_same(llm.generate(prompts(), PARAMS), references["gqa8x4"])
        assert most_in_flight == 2
    finally:
        engine.shutdown()


def test_each_group_sizes_its_own_kv_pool(model_dirs, references):
    """Under `tp2,single` a TP rank holds half the KV heads, so the same KV memory gives
    its group twice the blocks of the single rank's group."""
    block_bytes = 2 * 4 * 16 * 4 * 12 * 4  # K+V, 4 layers, 16 tokens, 4 KV heads of 12, fp32
    options = {**COMMON, "layout": "tp2,single", "num_blocks": None,
               "kv_cache_memory": 96 * block_bytes}
    llm = LLM(model_dirs["gqa8x4"], **options)
    try:
        assert llm.llm_engine.executor.rank_blocks == [192, 192, 96]
        assert [r.block_manager.num_blocks for r in llm.llm_engine.replicas] == [192, 96]
        assert_same(llm.generate(prompts(), PARAMS), references["gqa8x4"])
    finally:
        llm.llm_engine.shutdown()
