"""The engine's side of structured output: each constrained request's grammar matcher,
advanced with every token the request samples, and the bitmask of the tokens its next
sample may take. The engine computes the masks and sends them with the step, so every
rank that samples applies the same mask whatever the plan (and the output rank) is; a
mask needs the previous token, so a replica running a constrained request keeps one
step in flight (no async scheduling for it)."""
import threading
from dataclasses import dataclass

import numpy as np

from parashift.structured.grammars import GrammarCompiler, allows_any_token
from parashift.structured.params import StructuredOutputsParams

# A constrained request that no token of the vocabulary can continue fails with this reason:
# its constraint, not the engine, is at fault (the server answers 400).
NO_CONTINUATION = "no token of the model's vocabulary continues its structured output"


@dataclass
class TokenMasks:
    """Bitmasks for some of a step's chunks: row i (int32 words, bit j of word w allows
    token 32 * w + j) is for chunk chunks[i]."""
    chunks: list[int]
    bitmask: np.ndarray  # int32 [len(chunks), ceil(vocab / 32)]


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        self._tokenizer, self._vocab_size, self._stop_ids = tokenizer, vocab_size, stop_token_ids
        self._compiler: GrammarCompiler | None = None  # built at the first constrained request
        self._compiler_lock = threading.Lock()  # the HTTP server compiles from its own thread
        self._matchers: dict[str, object] = {}

    @property
    def compiler(self) -> GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size, self._stop_ids)
            return self._compiler

    def add(self, request_id: str, params: StructuredOutputsParams) -> None:
        """Raises InvalidGrammarError (a ValueError) naming what cannot be compiled."""
        import xgrammar as xgr
        self._matchers[request_id] = xgr.GrammarMatcher(self.compiler.grammar_for(params))

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def tracks(self, request_id: str) -> bool:
        return request_id in self._matchers

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advances the request's matcher; False if the grammar refuses the token."""
        return self._matchers[request_id].accept_token(token_id)

    def can_continue(self, request_id: str) -> bool:
        return allows_any_token(self._matchers[request_id], self.compiler.info.vocab_size)

    def is_terminated(self, request_id: str) -> bool:
        return self._matchers[request_id].is_terminated()

    def masks(self, request_ids: list[str | None]) -> TokenMasks | None:
        """Masks for the positions of `request_ids` (None: a chunk that does not sample)
        whose request is constrained; None if there is none."""
        import xgrammar as xgr
        rows = [i for i, r in enumerate(request_ids) if r is not None and r in self._matchers]
        if not rows:
            return None
        bitmask = xgr.allocate_token_bitmask(len(rows), self.compiler.info.vocab_size)
        for j, i in enumerate(rows):
            self._matchers[request_ids[i]].fill_next_token_bitmask(bitmask, j)
        return TokenMasks(rows, bitmask.numpy())
