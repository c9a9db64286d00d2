"""Prompt logprobs on the engine side: the spans the ranks computed in each prefill step
(worker/prompt_logprobs.py), gathered by position until the request's prompt is computed
(its first token is sampled), then handed to the output processor with that token, and
made into vLLM's shape there (`make_prompt_logprobs`).

A position computed twice (a request preempted and recomputed) keeps one entry: the same
logits give the same values. A request that asks for prompt logprobs takes no prefix-cache
hit (scheduler.py), so every position of its prompt goes through the model."""
import logging

from parashift.engine.sequence import SequenceStatus
from parashift.outputs import Logprob, PromptLogprobs

logger = logging.getLogger(__name__)

# Per prompt position j (0 .. P-2): the logprob of prompt token j + 1, its rank, and the
# top ids and logprobs.
RawEntry = tuple[float, int, list[int], list[float]]


class PromptLogprobsCollector:

    def __init__(self):
        self.expected: set[str] = set()  # requests whose prompt logprobs have not gone
        self._partial: dict[str, dict[int, RawEntry]] = {}

    def expect(self, request_id: str) -> None:
        self.expected.add(request_id)

    def add(self, spans: list | None) -> None:
        """One step's spans: (request id, first position, logprobs, ranks, top ids,
        top logprobs)."""
        for request_id, first, logprobs, ranks, top_ids, top_lps in spans or ():
            entries = self._partial.setdefault(request_id, {})
            for i, entry in enumerate(zip(logprobs, ranks, top_ids, top_lps)):
                entries[first + i] = entry

    def take_computed(self, sampling) -> dict[str, list[RawEntry]] | None:
        """The entries of the expected requests among the sequences that sampled this
        step (their prompt is computed), by request id; they are forgotten here."""
        done = {}
        for seq in sampling:
            if seq.request_id in self.expected and seq.status is not SequenceStatus.FINISHED:
                done[seq.request_id] = self._take(seq.request_id, seq.num_prompt_tokens)
        return done or None

    def _take(self, request_id: str, num_prompt_tokens: int) -> list[RawEntry]:
        """The request's entries of every position but the prompt's last, in order."""
        self.expected.discard(request_id)
        entries = self._partial.pop(request_id, {})
        missing = [j for j in range(num_prompt_tokens - 1) if j not in entries]
        if missing:  # a bug, not the request's fault: reported, the engine goes on
            logger.error("request %s: no prompt logprobs were computed for positions %s",
                         request_id, missing[:5])
        return [entries.get(j) for j in range(num_prompt_tokens - 1)]

    def forget(self, request_id: str) -> None:
        self.expected.discard(request_id)
        self._partial.pop(request_id, None)


def make_prompt_logprobs(prompt_token_ids: list[int], raw: list[RawEntry],
                         decode=None) -> PromptLogprobs:
    """vLLM's RequestOutput.prompt_logprobs: None for the first prompt token, then per
    token {token id: Logprob}, the prompt token first, then the top alternatives.
    `decode(ids) -> texts` fills decoded_token (None without a tokenizer)."""
    ids = list(prompt_token_ids[1:])
    for entry in raw:
        ids += entry[2] if entry is not None else []
    texts = iter(decode(ids) if decode is not None else [None] * len(ids))
    result: PromptLogprobs = [None]
    shown = [next(texts) for _ in prompt_token_ids[1:]]
    for token, text, raw_entry in zip(prompt_token_ids[1:], shown, raw):
        if raw_entry is None:
            result.append(None)
            continue
        logprob, rank, top_ids, top_lps = raw_entry
        entry = {token: Logprob(logprob, rank, text)}
        for i, (top_id, top_lp) in enumerate(zip(top_ids, top_lps)):
            top_text = next(texts)
            if top_id not in entry:
                entry[top_id] = Logprob(top_lp, i + 1, top_text)
        result.append(entry)
    return result


def token_texts_of(tokenizer):
    """`decode(ids) -> texts`, each token's text alone; None without a tokenizer."""
    if tokenizer is None:
        return None
    return lambda ids: tokenizer.batch_decode([[i] for i in ids])
