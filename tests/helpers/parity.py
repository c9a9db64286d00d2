"""Running parashift and Hugging Face side by side on one sequence."""
import random

import torch

from parashift import LLM
from parashift.sampling_params import SamplingParams

NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
LOGITS_RTOL = 1e-4


def random_prompt(length: int, seed: int, vocab: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def load(directory, **options) -> LLM:
    """A CPU fp32 LLM of a tiny checkpoint, token ids in and out, no prefix cache."""
    defaults = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=64,
                    attention_backend="torch", enable_prefix_caching=False)
    return LLM(model=str(directory), **{**defaults, **options})


@torch.inference_mode()
def prompt_logits(llm, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] logits of every prompt position: the prompt goes through
    the engine as a request for one token while a hook on the runner's model keeps the
    hidden states of every row (all steps, if the prefill is chunked)."""
    runner = llm.llm_engine.runner
    hidden: list[torch.Tensor] = []
    hook = runner.model.register_forward_hook(lambda _m, _in, out: hidden.append(out.clone()))
    try:
        out = llm.generate([list(token_ids)], SamplingParams(temperature=0.0, max_tokens=1))[0]
    finally:
        hook.remove()
    assert out.num_cached_tokens == 0, "prefix-cache hit: use enable_prefix_caching=False"
    logits = runner.model.compute_logits(torch.cat(hidden)).float().cpu()
    assert logits.shape[0] == len(token_ids)
    assert out.outputs[0].token_ids == [logits[-1].argmax().item()]
    return logits


@torch.inference_mode()
def hf_prompt_logits(model, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(model, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF greedy continuation that never stops early at an EOS token."""
    model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([token_ids]), attention_mask=torch.ones(1, len(token_ids),
                         dtype=torch.long), do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=0, eos_token_id=None, temperature=None, top_p=None,
                         top_k=None)
    return out[0, len(token_ids):].tolist()


def assert_prompt_logits_match(hf, llm, prompt: list[int]) -> None:
    ours, theirs = prompt_logits(llm, prompt), hf_prompt_logits(hf, prompt)
    assert ours.shape == theirs.shape
    assert max_relative_diff(ours, theirs) < LOGITS_RTOL


def max_relative_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|."""
    return ((a - b).abs().max() / b.abs().max()).item()
