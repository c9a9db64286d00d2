"""A rank's copy of the tokens of each request with penalties, on the device, by position.

The rank already sees every token a request computes: prompt chunks bring their ids, and
a decode chunk's input is the token sampled the step before (a placeholder under async
scheduling, filled from the previous step's samples on the device, which this rank
sampled too). Only the prompt comes in the step message, once per request: its chunks
skip what the prefix cache holds."""
import torch

from parashift.layers.penalties import PADDING_TOKEN, TokenHistory
from parashift.step.message import PLACEHOLDER_TOKEN
from parashift.uploads import upload
from parashift.worker.step_chunks import SeqChunk


class TokenHistoryStore:
    """One row of a [slots, capacity] int64 buffer per tracked request; both dimensions
    double when full."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffer = torch.full((0, 0), PADDING_TOKEN, dtype=torch.int64, device=device)
        self.slots: dict[str, int] = {}
        self.prompt_lens: dict[str, int] = {}
        self._free: list[int] = []

    def admit(self, request_id: str, prompt_token_ids: list[int]) -> None:
        if request_id in self.slots:
            return
        if not self._free:
            self._grow(max(8, 2 * self.buffer.shape[0]), self.buffer.shape[1])
        self._fit(len(prompt_token_ids))
        slot = self._free.pop()
        self.slots[request_id] = slot
        self.prompt_lens[request_id] = len(prompt_token_ids)
        self.buffer[slot, :len(prompt_token_ids)] = upload(prompt_token_ids, torch.int64,
                                                           self.device)

    def forget(self, request_id: str) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
            del self.prompt_lens[request_id]

    def record(self, chunks: list[SeqChunk], prev_tokens: torch.Tensor | None,
               prev_index) -> None:
        """Writes the tracked requests' chunk tokens at their positions; a placeholder
        comes from the previous step's samples (`prev_index`: a block-table row -> its
        index in prev_tokens). A recomputed (preempted) request writes the same tokens
        again; tokens past a sampled row's end (rejected drafts) are never read."""
        tracked = [c for c in chunks if c.request_id in self.slots] if self.slots else []
        if not tracked:
            return
        self._fit(max(c.seq_len for c in tracked))
        known_at, known_tokens, pending_at, sources = ([], []), [], ([], []), []
        for c in tracked:
            slot, tokens = self.slots[c.request_id], c.token_ids
            if tokens and tokens[-1] == PLACEHOLDER_TOKEN:  # only ever the last one
                pending_at[0].append(slot)
                pending_at[1].append(c.seq_len - 1)
                sources.append(int(prev_index[c.row]))
                tokens = tokens[:-1]
            known_at[0].extend([slot] * len(tokens))
            known_at[1].extend(range(c.start_pos, c.start_pos + len(tokens)))
            known_tokens += tokens
        if known_tokens:
            self._write(known_at, upload(known_tokens, torch.int64, self.device))
        if sources:
            self._write(pending_at, prev_tokens.index_select(
                0, upload(sources, torch.int64, self.device)))

    def batch(self, sampling: list[SeqChunk]) -> TokenHistory | None:
        """The histories of the sampled rows whose requests are tracked; None if none is.
        A row's history ends at its own last token: a verification's row at drafted
        position j sees the draft's tokens before j (sampled as if they were accepted)."""
        if not self.slots:  # no request with penalties: the common case
            return None
        rows = [j for j, c in enumerate(sampling) if c.request_id in self.slots]
        if not rows:
            return None
        ids = [sampling[j].request_id for j in rows]
        ends = [sampling[j].seq_len for j in rows]
        lengths = upload(ends, torch.int64, self.device).unsqueeze(1)
        prompt_lens = upload([self.prompt_lens[r] for r in ids], torch.int64,
                             self.device).unsqueeze(1)
        width = max(ends)
        slots = upload([self.slots[r] for r in ids], torch.int64, self.device)
        tokens = self.buffer.index_select(0, slots)[:, :width]
        position = torch.arange(width, device=self.device).unsqueeze(0)
        valid = position < lengths
        return TokenHistory(rows, tokens.masked_fill(~valid, PADDING_TOKEN),
                            valid & (position >= prompt_lens))

    def _write(self, index: tuple[list[int], list[int]], values: torch.Tensor) -> None:
        slots, positions = (upload(v, torch.int64, self.device) for v in index)
        self.buffer.index_put_((slots, positions), values)

    def _fit(self, length: int) -> None:
        if length > self.buffer.shape[1]:
            self._grow(self.buffer.shape[0], max(length, 2 * self.buffer.shape[1]))

    def _grow(self, num_slots: int, capacity: int) -> None:
        old = self.buffer
        self.buffer = torch.full((num_slots, capacity), PADDING_TOKEN, dtype=torch.int64,
                                 device=self.device)
        self.buffer[:old.shape[0], :old.shape[1]] = old
        self._free += range(num_slots - 1, old.shape[0] - 1, -1)
