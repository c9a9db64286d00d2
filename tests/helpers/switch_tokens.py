"""Greedy tokens of a tiny Llama engine under an environment switch, each (quantization,
value) run once: for tests that a fused path gives the unfused path's tokens."""
from typing import Callable

import pytest

from tests.deterministic.test_batch_invariance import GREEDY, requests
from tests.engine.conftest import tiny_llm


def engine_tokens(model_dir, device: str, env: str, value: str, prompts: list,
                  **llm_args) -> list:
    """The greedy tokens of a bf16 engine (FP8 weights where llm_args' quantization asks)
    for `prompts` with env=value."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(env, value)
        llm = tiny_llm(model_dir, device=device, dtype="bfloat16", **llm_args)
        try:
            return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        finally:
            llm.llm_engine.shutdown()


def switch_tokens(model_dir, device: str, env: str, prompts: int = 8,
                  max_num_seqs: int = 4) -> Callable[[str | None, str], list]:
    """tokens(quantization, value): the engine's greedy tokens for `prompts` prompts with
    env=value, bf16 weights (quantization None) or FP8, at most max_num_seqs a step."""
    prompts, _ = requests(prompts)
    runs = {}

    def tokens(quantization, value):
        if (quantization, value) not in runs:
            runs[quantization, value] = engine_tokens(model_dir, device, env, value, prompts,
                                                      quantization=quantization,
                                                      max_num_seqs=max_num_seqs)
        return runs[quantization, value]
    return tokens
