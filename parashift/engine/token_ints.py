"""One Python int object per token id, shared by every list that holds the token.

A step's sampled tokens arrive as fresh int objects (a tensor's `tolist()`, or a message
from another process), one per token, scattered in memory. Every list copy of a request's
tokens (its cumulative outputs, the detokenizer's windows, prefix-cache hashes) touches
each of its int objects to count a reference, so long outputs cost a cache miss per token
per step. Mapped onto one object per id, they touch the few objects of the ids in use."""


class TokenInts:
    def __init__(self, vocab_size: int):
        self._ints = list(range(vocab_size))

    def canonical(self, tokens: list[int]) -> list[int]:
        """The same values, each the shared object of its id; `tokens` itself where one is
        out of the vocabulary (its value must not change)."""
        if not tokens or min(tokens) < 0 or max(tokens) >= len(self._ints):
            return tokens
        return list(map(self._ints.__getitem__, tokens))
