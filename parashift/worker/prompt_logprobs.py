"""Prompt logprobs (SamplingParams.prompt_logprobs) on a rank, computed in the prefill:
which rows of a step are prompt positions of the requests that asked, and their logprobs
from the last stage's hidden states. The row of position j predicts prompt token j + 1,
so a chunk gives the logprobs of the prompt tokens after each of its positions (the
prompt's last position predicts the first output token: it is sampled, not reported).

Every rank of the last stage finds the same rows (from the step's chunks and the prompts
the step messages sent) and runs the LM head over them (its collectives); the output rank
reports them, per span of consecutive positions of one request:
(request id, first position, prompt tokens' logprobs, their ranks, top ids, top logprobs)."""
from dataclasses import dataclass

import torch

from parashift.uploads import upload
from parashift.worker.step_chunks import DecodeChunks, SeqChunk

# Rows through the LM head at a time: a long prompt's logits would not fit at once.
ROWS_PER_SLICE = 512

Span = tuple[str, int, list[float], list[int], list[list[int]], list[list[float]]]


@dataclass
class PromptRows:
    """A step's rows whose logprobs are reported, in step order, by span."""
    spans: list[tuple[str, int, int, int]]  # (request id, first position, count, top k)
    rows: list[int]                          # whole-step rows, every span's in order
    targets: list[int]                       # the prompt token each row predicts


class PromptLogprobRequests:
    """The requests on this rank that asked for prompt logprobs: their k and prompt."""

    def __init__(self):
        self._wanted: dict[str, tuple[int, list[int]]] = {}

    def admit(self, new_params: dict, prompts: dict[str, list[int]]) -> None:
        for request_id, params in new_params.items():
            if params.prompt_logprobs is not None:
                self._wanted[request_id] = (params.prompt_logprobs, prompts[request_id])

    def forget(self, request_id: str) -> None:
        self._wanted.pop(request_id, None)

    def rows_of(self, chunks: list[SeqChunk]) -> PromptRows | None:
        """The step's prompt rows; None where it has none (a decode step: no pass)."""
        if not self._wanted or isinstance(chunks, DecodeChunks):
            return None
        found = PromptRows([], [], [])
        row = 0
        for chunk in chunks:
            wanted = self._wanted.get(chunk.request_id)
            if wanted is not None:
                k, prompt = wanted
                first, end = chunk.start_pos, min(chunk.seq_len, len(prompt) - 1)
                if end > first:
                    found.spans.append((chunk.request_id, first, end - first, k))
                    found.rows += range(row, row + end - first)
                    found.targets += prompt[first + 1:end + 1]
            row += len(chunk.token_ids)
        return found if found.spans else None


def gather_rows(hidden: torch.Tensor, rows: list[int], local: range, sp) -> torch.Tensor:
    """Hidden states of whole-step `rows`, from the SP rank holding each (every SP rank
    calls it with the same rows)."""
    out = torch.zeros(len(rows), hidden.shape[-1], dtype=hidden.dtype, device=hidden.device)
    pairs = [(i, row - local.start) for i, row in enumerate(rows) if row in local]
    if pairs:  # one gather and one scatter, not a copy kernel per row
        dst, src = (upload(v, torch.int64, hidden.device) for v in zip(*pairs))
        out.index_copy_(0, dst, hidden.index_select(0, src))
    return out if sp.size == 1 else sp.all_reduce(out)  # each row non-zero on one rank


def prompt_logprobs(compute_logits, hidden: torch.Tensor, found: PromptRows, local: range,
                    sp, report: bool) -> list[Span] | None:
    """The spans' logprobs from this rank's hidden states (the last stage's output);
    every rank of the stage runs the LM head, the output rank (`report`) returns them."""
    selected = gather_rows(hidden, found.rows, local, sp)
    targets = torch.tensor(found.targets, dtype=torch.int64, device=hidden.device)
    k = max(span[3] for span in found.spans)
    lps, ranks, top_ids, top_lps = [], [], [], []
    for start in range(0, len(found.rows), ROWS_PER_SLICE):
        logits = compute_logits(selected[start:start + ROWS_PER_SLICE])
        if not report:
            continue
        logprobs = logits.float().log_softmax(dim=-1)
        target = logprobs.gather(1, targets[start:start + ROWS_PER_SLICE].unsqueeze(1))
        lps += target.squeeze(1).tolist()
        ranks += ((logprobs > target).sum(dim=-1) + 1).tolist()
        top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        top_lps += top.values.tolist()
        top_ids += top.indices.tolist()
    if not report:
        return None
    spans, at = [], 0
    for request_id, first, count, span_k in found.spans:
        end = at + count
        spans.append((request_id, first, lps[at:end], ranks[at:end],
                      [ids[:span_k] for ids in top_ids[at:end]],
                      [values[:span_k] for values in top_lps[at:end]]))
        at = end
    return spans
