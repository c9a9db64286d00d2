"""Parallel sampling (`n`, `best_of`): a request fans out into child requests, one sample
each, whose outputs fold back into one RequestOutput with a CompletionOutput per sample.

The first child is scheduled alone; its siblings join once it has computed the prompt
(its first output), so that they take the prompt's KV blocks from the prefix cache
instead of computing them again."""
import dataclasses

from parashift.engine.sequence import Sequence
from parashift.outputs import CompletionOutput, RequestOutput, join_deltas
from parashift.sampling_params import SEED_MAX, SEED_MIN, SamplingParams


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """One sample's options. Its seed is the request's plus its index (wrapped to 64
    bits): siblings differ, and the same request gives the same samples again. best_of
    ranks by cumulative logprob, so its children always report the sampled token's. The
    first child alone computes the prompt's logprobs (the others take its blocks from the
    prefix cache)."""
    seed = None if params.seed is None else (
        (params.seed + index - SEED_MIN) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN)
    logprobs = params.logprobs
    if logprobs is None and params.num_samples > params.n:
        logprobs = 0
    # children report cumulative outputs, which the parent folds (and cuts into deltas)
    return dataclasses.replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs,
                               output_kind="cumulative",
                               prompt_logprobs=params.prompt_logprobs if index == 0 else None)


def cumulative_logprob(completion: CompletionOutput, start: int = 0,
                       total: float = 0.0) -> float | None:
    """The sampled tokens' logprobs summed in order; `total` the sum of the first `start`."""
    if completion.logprobs is None:
        return None
    pairs = zip(completion.token_ids[start:], completion.logprobs[start:])
    return sum((lp[token] for token, lp in pairs), total)


class ParentRequest:
    """A request with several samples: its children's ids and latest outputs."""

    def __init__(self, request_id: str, params: SamplingParams, priority: int = 0):
        self.request_id, self.params, self.priority = request_id, params, priority
        self.child_ids = [f"{request_id}#{i}" for i in range(params.num_samples)]
        self._index = {child: i for i, child in enumerate(self.child_ids)}
        self.completions: dict[int, CompletionOutput] = {}
        self.num_cached_tokens: dict[int, int] = {}
        self._finished: set[int] = set()
        self._sent: dict[int, tuple[int, int]] = {}  # delta outputs: chars, tokens given
        self._summed: dict[int, tuple[int, float]] = {}  # tokens in the logprob sum, the sum
        self.siblings_admitted = params.num_samples == 1
        self.prompt_logprobs = None  # the first child's, once it has them
        self._prompt_logprobs_sent = False  # delta outputs give them once

    def child(self, index: int, prompt_token_ids: list[int], prompt: str | None) -> Sequence:
        return Sequence(self.child_ids[index], prompt_token_ids,
                        child_params(self.params, index), self.priority, prompt)

    def update(self, output: RequestOutput) -> RequestOutput | None:
        """Folds in a child's output; returns the request's, or None while best_of's
        choice is still open (it is made once every child has finished) or while a
        final-only request runs."""
        index = self._index[output.request_id]
        completion = output.outputs[0]
        self.completions[index] = dataclasses.replace(
            completion, index=index, cumulative_logprob=self._logprob_sum(index, completion))
        self.num_cached_tokens[index] = output.num_cached_tokens
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        if output.finished:
            self._finished.add(index)
        finished = output.error is not None or len(self._finished) == len(self.child_ids)
        ranked = self.params.num_samples > self.params.n
        if (ranked or self.params.output_kind == "final_only") and not finished:
            return None
        if ranked:  # its one output, once every child has finished
            chosen = self._best() if output.error is None else \
                [self.completions[i] for i in sorted(self.completions)]
        elif self.params.output_kind == "delta":  # what is new in the sample that moved
            chosen = [self._delta(index)]
        else:
            chosen = [self.completions[i] for i in sorted(self.completions)]
        return RequestOutput(self.request_id, output.prompt, output.prompt_token_ids, chosen,
                             finished, sum(self.num_cached_tokens.values()),
                             error=output.error, prompt_logprobs=self._take_prompt_logprobs())

    def _take_prompt_logprobs(self):
        if self.params.output_kind != "delta":
            return self.prompt_logprobs
        if self._prompt_logprobs_sent or self.prompt_logprobs is None:
            return None
        self._prompt_logprobs_sent = True
        return self.prompt_logprobs

    def _logprob_sum(self, index: int, completion: CompletionOutput) -> float | None:
        """A child's cumulative logprob, adding only the tokens new since its last output
        (its outputs are cumulative: each extends the one before)."""
        start, total = self._summed.get(index, (0, 0.0))
        if start > len(completion.token_ids):  # a shorter output than the last: sum anew
            start, total = 0, 0.0
        result = cumulative_logprob(completion, start, total)
        if result is not None:
            self._summed[index] = len(completion.token_ids), result
        return result

    def _delta(self, index: int) -> CompletionOutput:
        completion = self.completions[index]
        chars, tokens = self._sent.get(index, (0, 0))
        self._sent[index] = len(completion.text), len(completion.token_ids)
        logprobs = completion.logprobs[tokens:] if completion.logprobs is not None else None
        return dataclasses.replace(completion, text=completion.text[chars:],
                                   token_ids=completion.token_ids[tokens:], logprobs=logprobs)

    def _best(self) -> list[CompletionOutput]:
        """The n samples of highest cumulative logprob, best first, numbered 0 to n-1;
        without their logprobs where the request did not ask for them."""
        ranked = sorted(self.completions.values(), key=lambda c: c.cumulative_logprob,
                        reverse=True)[:self.params.n]
        keep_logprobs = self.params.logprobs is not None
        return [dataclasses.replace(c, index=i, logprobs=c.logprobs if keep_logprobs else None)
                for i, c in enumerate(ranked)]


def fold_children(outputs: list[RequestOutput], parent_of: dict[str, ParentRequest],
                  parents: dict[str, ParentRequest], end) -> list[RequestOutput]:
    """Children's outputs folded into their requests' (one output per request of several
    samples, in the place of its first); a request of one sample keeps every output as it
    came (two delta outputs of one step, taken together, are both what is new). `end` is
    called with a request's id once its folded output is its last: it ends the children
    still running (an error) and forgets the request."""
    folded: list[RequestOutput] = []
    place: dict[str, int] = {}  # where each request of several samples has its output
    for output in outputs:
        parent = parent_of.get(output.request_id)
        if parent is None:
            folded.append(output)
            continue
        if parent.request_id not in parents:
            continue  # a sibling failed earlier in this step: the request has ended
        merged = parent.update(output)
        if merged is not None:
            at = place.setdefault(parent.request_id, len(folded))
            if at == len(folded):
                folded.append(merged)
            elif parent.params.output_kind == "delta":
                folded[at] = join_deltas(folded[at], merged)
            else:
                folded[at] = merged
        if merged is not None and merged.finished:
            end(parent.request_id)
    return folded
