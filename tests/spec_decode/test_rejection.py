"""Verification keeps the target distribution: a statistical test over a tiny vocabulary.

The target is a bigram table of 6 tokens; drafts are deterministic (a point mass, as every
proposer's). Sequences are generated with speculation through the engine's own Sampler
(one sample per verified position) and `accepted_tokens`; the empirical distribution of the
first two tokens must pass a chi-square test against the exact one, while a rule that
accepts drafts it should not (the negative control) must fail it."""
import numpy as np
import torch

from parashift.layers.sampler import Sampler
from parashift.sampling_params import SamplingParams
from parashift.spec_decode.rejection import accepted_tokens

VOCAB, K, SAMPLES = 6, 3, 4000
# chi-square critical value at p = 0.001 with 35 degrees of freedom (36 cells - 1)
CRITICAL = 66.62


def table() -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(VOCAB, VOCAB, generator=generator) * 1.5


def draft_of(context: list[int]) -> list[int]:
    """A deterministic draft that is often right and often wrong."""
    return [(context[-1] + 1 + j) % VOCAB for j in range(K)]


def generate(accept, length: int = 2) -> np.ndarray:
    """SAMPLES sequences of `length` tokens after token 0, speculating all the way."""
    logits_of, sampler = table(), Sampler("cpu", seed=0)
    params = SamplingParams(temperature=1.0)
    contexts = [[0] for _ in range(SAMPLES)]
    while any(len(c) <= length for c in contexts):
        live = [c for c in contexts if len(c) <= length]
        drafts = [draft_of(c) for c in live]
        rows = [([*c, *d[:j]][-1]) for c, d in zip(live, drafts) for j in range(K + 1)]
        sampled = sampler(logits_of[rows], [params] * len(rows), [None] * len(rows),
                          with_logprobs=False).token_ids.tolist()
        for i, (context, draft) in enumerate(zip(live, drafts)):
            context += accept(draft, sampled[i * (K + 1):(i + 1) * (K + 1)], context)
    return np.array([c[1:length + 1] for c in contexts])


def chi_square(pairs: np.ndarray) -> float:
    probs = table().softmax(dim=-1).double().numpy()
    expected = probs[0][:, None] * probs  # p(t1 | 0) p(t2 | t1)
    counts = np.zeros((VOCAB, VOCAB))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    expected = expected * len(pairs)
    return float(((counts - expected) ** 2 / expected).sum())


def test_verification_keeps_the_target_distribution():
    assert chi_square(generate(lambda draft, samples, _: accepted_tokens(draft, samples))) \
        < CRITICAL


def test_a_wrong_acceptance_rule_fails_the_same_test():
    """Accepting the first draft token whenever the target gives it some mass (p >= 0.1)
    is not speculative sampling: the test must see it."""
    probs = table().softmax(dim=-1)

    def lenient(draft, samples, context):
        if probs[context[-1], draft[0]] >= 0.1:
            return [draft[0], *accepted_tokens(draft[1:], samples[1:])]
        return accepted_tokens(draft, samples)
    assert chi_square(generate(lenient)) > CRITICAL
