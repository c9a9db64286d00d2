"""Penalties, logit bias and parallel samples under a 2-rank plan give the tokens of one
rank: every rank keeps its own token history from the step messages and its samples."""
from parashift import SamplingParams
from tests.distributed.test_plans import prompts
from tests.engine.conftest import tiny_llm

PARAMS = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.6),
          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=1.0,
                         presence_penalty=0.5, logit_bias={7: 2.0}),
          SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=12, ignore_eos=True,
                         frequency_penalty=0.6),
          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]


def run(model_dir, **plan):
    with tiny_llm(model_dir, max_num_batched_tokens=40, **plan) as llm:
        outputs = llm.generate(prompts(seed=1, n=len(PARAMS)), PARAMS)
    return [[c.token_ids for c in o.outputs] for o in outputs]


def test_tensor_parallel_matches_one_rank(tiny_llama_dir):
    reference = run(tiny_llama_dir)
    assert run(tiny_llama_dir, tensor_parallel_size=2) == reference
    assert len(reference[2]) == 2 and reference[2][0] != reference[2][1]
