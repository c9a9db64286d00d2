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

    def allowed_draft(self, request_id: str, draft: list[int]) -> list[int]:
        """The draft up to the first token the request's grammar refuses (speculative
        decoding); the matcher is left where it was."""
        matcher = self._matchers[request_id]
        count = 0
        for token in draft:
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
            count += 1
        if count:
            matcher.rollback(count)
        return draft[:count]

    def masks(self, request_ids: list[str | None],
              drafts: list[list[int] | None] | None = None) -> TokenMasks | None:
        """Masks for the positions of `request_ids` (None: a chunk that does not sample)
        whose request is constrained; None if there is none. A chunk with a draft
        (`drafts[i]`, speculative decoding) has a mask for each verified position: the
        grammar's state after each prefix of its draft (a row each, in order)."""
        import xgrammar as xgr
        chunks = [i for i, r in enumerate(request_ids) if r is not None and r in self._matchers]
        if not chunks:
            return None
        counts = [1 + len(drafts[i] or ()) if drafts else 1 for i in chunks]
        bitmask = xgr.allocate_token_bitmask(sum(counts), self.compiler.info.vocab_size)
        row = 0
        for i, count in zip(chunks, counts):
            matcher = self._matchers[request_ids[i]]
            matcher.fill_next_token_bitmask(bitmask, row)
            for token in drafts[i][:count - 1] if count > 1 else ():
                row += 1
                matcher.accept_token(token)  # (allowed: allowed_draft cut the draft)
                matcher.fill_next_token_bitmask(bitmask, row)
            if count > 1:
                matcher.rollback(count - 1)
            row += 1
        rows = [i for i, count in zip(chunks, counts) for _ in range(count)]
        return TokenMasks(rows, bitmask.numpy())
