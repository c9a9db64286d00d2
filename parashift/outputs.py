"""What a request returns, in the shape of vLLM's RequestOutput."""
import dataclasses
from dataclasses import dataclass, field


@dataclass(slots=True)  # slots: a decode step builds one of each per running request
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None  # the sampled tokens' (parallel sampling)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class Logprob:
    """A prompt token's logprob, its rank in the model's distribution (1: the most likely)
    and its text (vLLM's Logprob)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per prompt token: None for the first, then {token id: Logprob} of the prompt token and
# the top alternatives (SamplingParams.prompt_logprobs).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # why the request failed (finish reason "error")
    prompt_logprobs: PromptLogprobs | None = None


def join_deltas(first: RequestOutput, second: RequestOutput) -> RequestOutput:
    """Two delta outputs of a request as one: each sample's text, tokens and logprobs
    joined, the second's finish and state."""
    joined = {c.index: c for c in first.outputs}
    for c in second.outputs:
        before = joined.get(c.index)
        if before is not None:
            logprobs = (before.logprobs or []) + c.logprobs if c.logprobs is not None \
                else before.logprobs
            c = dataclasses.replace(c, text=before.text + c.text,
                                    token_ids=before.token_ids + c.token_ids, logprobs=logprobs)
        joined[c.index] = c
    return dataclasses.replace(second, outputs=[joined[i] for i in sorted(joined)],
                               prompt_logprobs=second.prompt_logprobs or first.prompt_logprobs)
