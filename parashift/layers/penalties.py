"""Logits processors that read a request's options or tokens: logit bias, and the
repetition, frequency and presence penalties. Each runs batched over the rows that use
it, and not at all when none does."""
from dataclasses import dataclass

import torch

from parashift.sampling_params import SamplingParams
from parashift.uploads import upload

PADDING_TOKEN = -1  # a history slot past the request's length


@dataclass
class TokenHistory:
    """The tokens of the batch's rows with penalties, padded to one length."""
    rows: list[int]           # their rows in the batch's logits
    token_ids: torch.Tensor   # [R, L] int64, PADDING_TOKEN past each row's length
    is_output: torch.Tensor   # [R, L] bool: a generated token (not the prompt's)


def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams],
                            history: TokenHistory | None) -> torch.Tensor:
    """Logit bias first, then the penalties (vLLM's order); returns `logits` itself when
    no row uses either."""
    logits = apply_logit_bias(logits, params)
    if history is not None and history.rows:
        logits = apply_penalties(logits, params, history)
    return logits


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    entries = [(row, token, bias) for row, p in enumerate(params) if p.logit_bias
               for token, bias in p.logit_bias.items()]
    if not entries:
        return logits
    rows, tokens, biases = zip(*entries)
    index = (upload(rows, torch.int64, logits.device), upload(tokens, torch.int64, logits.device))
    return logits.index_put(index, upload(biases, logits.dtype, logits.device), accumulate=True)


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams],
                    history: TokenHistory) -> torch.Tensor:
    """Repetition (HF/vLLM: a token seen in the prompt or the output has a positive logit
    divided by the penalty, a negative one multiplied), then frequency and presence
    (OpenAI: minus penalty x count, and minus penalty once, over the output's tokens)."""
    vocab_size, device = logits.shape[1], logits.device
    chosen = [params[row] for row in history.rows]
    # Padding counts in an extra column that is dropped.
    tokens = history.token_ids.masked_fill(history.token_ids == PADDING_TOKEN, vocab_size)
    seen = torch.zeros(len(chosen), vocab_size + 1, dtype=torch.bool, device=device)
    seen.scatter_(1, tokens, True)
    output_tokens = tokens.masked_fill(~history.is_output, vocab_size)
    counts = torch.zeros(len(chosen), vocab_size + 1, dtype=logits.dtype, device=device)
    counts.scatter_add_(1, output_tokens, torch.ones_like(output_tokens, dtype=logits.dtype))
    seen, counts = seen[:, :vocab_size], counts[:, :vocab_size]

    def column(name: str) -> torch.Tensor:
        return upload([getattr(p, name) for p in chosen], logits.dtype, device).unsqueeze(1)

    rows = upload(history.rows, torch.int64, device)
    penalized = logits.index_select(0, rows)
    repetition = column("repetition_penalty")
    repeated = torch.where(penalized > 0, penalized / repetition, penalized * repetition)
    penalized = torch.where(seen, repeated, penalized)
    penalized = (penalized - column("frequency_penalty") * counts
                 - column("presence_penalty") * (counts > 0).to(logits.dtype))
    return logits.index_copy(0, rows, penalized)
