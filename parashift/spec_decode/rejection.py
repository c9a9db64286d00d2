"""Verification of a deterministic draft (a point-mass proposal q = 1 at the draft token).

Standard speculative sampling accepts draft token d with probability min(1, p(d) / q(d))
= p(d) and, on a rejection, samples from the residual max(p - q, 0), normalized: p with d
taken out. The target's own sample x ~ p at the same position does exactly that: x == d
with probability p(d), and given x != d it is distributed as the residual. So the ranks
sample one token at every verified position (the same sampler, seeds and processors as a
plain decode), and the draft is accepted while it equals those samples; the first sample
that differs (or the one after the whole draft) is the step's last token. Greedy: the
samples are the argmax, so the output is the one without speculation, token for token."""


def accepted_tokens(draft: list[int], samples: list[int]) -> list[int]:
    """The tokens a verification appends: `samples[i]` is the target's token after the
    context and draft[:i] (len(samples) == len(draft) + 1)."""
    for i, token in enumerate(draft):
        if samples[i] != token:
            return samples[:i + 1]
    return samples

