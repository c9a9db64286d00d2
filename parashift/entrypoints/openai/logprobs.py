"""Engine logprobs (one {token_id: logprob} dict per generated token, holding the
sampled token and the top alternatives) in the two OpenAI response shapes."""
from parashift.entrypoints.openai.protocol import (ChatLogprobs, CompletionLogprobs,
                                                   PromptLogprob, TokenLogprob, TopLogprob)
from parashift.outputs import PromptLogprobs


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda item: item[1], reverse=True)[:k]


def completion_logprobs(decode, token_ids: list[int], entries: list[dict[int, float]],
                        num_top: int, text_offset: int) -> CompletionLogprobs:
    """The /v1/completions shape; `text_offset` is where the first token starts."""
    result = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        token = decode(token_id)
        result.tokens.append(token)
        result.token_logprobs.append(entry.get(token_id))
        top = {decode(tid): lp for tid, lp in _top(entry, num_top)} if num_top else None
        result.top_logprobs.append(top)
        result.text_offset.append(text_offset)
        text_offset += len(token)
    return result


def chat_logprobs(decode, token_ids: list[int], entries: list[dict[int, float]],
                  num_top: int) -> ChatLogprobs:
    """The /v1/chat/completions shape."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        token = decode(token_id)
        tops = [_top_logprob(decode(tid), lp) for tid, lp in _top(entry, num_top)]
        logprob = entry.get(token_id, float("-inf"))
        content.append(TokenLogprob(token=token, logprob=_finite(logprob),
                                    bytes=list(token.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)


def _top_logprob(token: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=token, logprob=_finite(logprob), bytes=list(token.encode()))


def _finite(value: float) -> float:
    """JSON has no -inf; OpenAI reports -9999.0 for impossible tokens."""
    return max(float(value), -9999.0)


def prompt_logprobs_field(prompt_logprobs: PromptLogprobs | None) -> list | None:
    """RequestOutput.prompt_logprobs in vLLM's response shape (token ids as keys)."""
    if prompt_logprobs is None:
        return None
    return [None if entry is None else {
        str(token_id): PromptLogprob(logprob=_finite(lp.logprob), rank=lp.rank,
                                     decoded_token=lp.decoded_token)
        for token_id, lp in entry.items()} for entry in prompt_logprobs]


def echo_logprobs(decode, prompt_ids: list[int], prompt_logprobs: PromptLogprobs,
                  num_top: int) -> CompletionLogprobs:
    """The prompt's tokens in the /v1/completions shape (`echo` with `logprobs`): the
    first token's logprob and alternatives are null, as OpenAI's."""
    first = decode(prompt_ids[0])
    entries = [{token_id: lp.logprob for token_id, lp in (entry or {}).items()}
               for entry in prompt_logprobs[1:]]
    rest = completion_logprobs(decode, prompt_ids[1:], entries, num_top, len(first))
    return CompletionLogprobs(tokens=[first, *rest.tokens],
                              token_logprobs=[None, *rest.token_logprobs],
                              top_logprobs=[None, *rest.top_logprobs],
                              text_offset=[0, *rest.text_offset])


def joined_logprobs(first: CompletionLogprobs, second: CompletionLogprobs | None
                    ) -> CompletionLogprobs:
    if second is None:
        return first
    return CompletionLogprobs(tokens=first.tokens + second.tokens,
                              token_logprobs=first.token_logprobs + second.token_logprobs,
                              top_logprobs=first.top_logprobs + second.top_logprobs,
                              text_offset=first.text_offset + second.text_offset)
