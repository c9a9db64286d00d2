"""Prompt lookup ("ngram"): the context's last n tokens (n from prompt_lookup_max down to
prompt_lookup_min) found earlier in the prompt or output; the tokens that followed that
latest earlier occurrence are the draft. Each request keeps an index from each n-gram to
where it last ended, extended by the tokens appended since its last draft (O(1) a token)."""
from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.proposer import Proposer


class _NgramIndex:
    __slots__ = ("ends", "indexed")

    def __init__(self):
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position it last ended at
        self.indexed = 0  # n-grams ending before this position are in `ends`


class NgramProposer(Proposer):

    def __init__(self, config: SpeculativeConfig):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self._indexes: dict[str, _NgramIndex] = {}

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        index = self._indexes.get(request_id)
        if index is None:
            index = self._indexes[request_id] = _NgramIndex()
        last = len(tokens) - 1
        self._extend(index, tokens, last)  # every n-gram ending before the last token
        for n in range(min(self.max_n, last), self.min_n - 1, -1):
            end = index.ends.get(tuple(tokens[last - n + 1:]))
            if end is not None:
                return tokens[end + 1:end + 1 + k]
        return []

    def _extend(self, index: _NgramIndex, tokens: list[int], stop: int) -> None:
        ends, min_n, max_n = index.ends, self.min_n, self.max_n
        for end in range(index.indexed, stop):
            for n in range(min_n, min(max_n, end + 1) + 1):
                ends[tuple(tokens[end - n + 1:end + 1])] = end
        index.indexed = max(index.indexed, stop)

    def finish(self, request_id: str, output_token_ids: list[int]) -> None:
        self._indexes.pop(request_id, None)
