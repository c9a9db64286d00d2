"""Greedy tokens of a tiny Llama engine under an environment switch, each (quantization,
value) run once: for tests that a fused path gives the unfused path's tokens."""
from typing import Callable

import pytest

from tests.deterministic.test_batch_invariance import GREEDY, requests
from tests.engine.conftest import tiny_llm


def switch_tokens(model_dir, device: str, env: str, prompts: int = 8,
                  max_num_seqs: int = 4) -> Callable[[str | None, str], list]:
    """tokens(quantization, value): the engine's greedy tokens for `prompts` prompts with
    env=value, bf16 weights (quantization None) or FP8, at most max_num_seqs a step."""
    prompts, _ = requests(prompts)
    runs = {}

    def tokens(quantization, value):
        if (quantization, value) not in runs:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(env, value)
                llm = tiny_llm(model_dir, device=device, dtype="bfloat16",
                               quantization=quantization, max_num_seqs=max_num_seqs)
                try:
                    outs = llm.generate(prompts, GREEDY)
                    runs[quantization, value] = [o.outputs[0].token_ids for o in outs]
                finally:
                    llm.llm_engine.shutdown()
        return runs[quantization, value]
    return tokens
