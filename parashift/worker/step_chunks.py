"""A step's chunks as the model runner sees them, once the rank has applied the step
message to what it already knows: each request's block-table row and sampling parameters."""
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import numpy as np

from parashift.sampling_params import SamplingParams
from parashift.step.message import PLACEHOLDER_ONLY, StepBatch

_REQUEST_ID = attrgetter("request_id")


@dataclass(slots=True)
class SeqChunk:
    """A chunk resolved on the rank: its row of the rank's block tables and its sampling
    parameters."""
    request_id: str
    token_ids: list[int]
    start_pos: int
    row: int                   # the request's row in RequestTables.tables
    sampling: SamplingParams | None  # set when a token is sampled after this chunk
    token_mask: np.ndarray | None = None  # the tokens its sample may take (structured output)
    num_samples: int = 1  # tokens sampled at its last positions (1 + k: a verification)

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


def sample_rows_of(chunks: list[SeqChunk]) -> list[SeqChunk]:
    """The chunks that sample, one per sampled row: a verification's (1 + k rows) as one
    chunk per verified position, each ending at its position (its seed's position)."""
    rows = []
    for chunk in chunks:
        if chunk.sampling is None:
            continue
        if chunk.num_samples == 1:
            rows.append(chunk)
            continue
        end, masks = len(chunk.token_ids), chunk.token_mask
        rows += [SeqChunk(chunk.request_id, chunk.token_ids[:end - back], chunk.start_pos,
                          chunk.row, chunk.sampling,
                          None if masks is None else masks[chunk.num_samples - 1 - back])
                 for back in range(chunk.num_samples - 1, -1, -1)]
    return rows


class DecodeChunks(Sequence):
    """The chunks of a step of plain decodes only (one placeholder token each, a token
    sampled), with their block-table rows and start positions as arrays, which
    build_step_inputs reads instead of passing over the chunks. The SeqChunks themselves
    are made when something first reads them (a sampler other than the argmax, penalties,
    the step check): a step of greedy decodes makes none."""

    def __init__(self, request_ids: list[str], rows: list[int], starts: list[int],
                 params: list[SamplingParams]):
        self._made, self._fields = None, (request_ids, starts, rows, params)
        self.rows = np.array(rows, np.int64)
        self.starts = np.array(starts, np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self._chunks()[index]

    def __iter__(self):
        return iter(self._chunks())

    def _chunks(self) -> list[SeqChunk]:
        if self._made is None:
            ids, starts, rows, params = self._fields
            self._made = list(map(SeqChunk, ids, repeat(PLACEHOLDER_ONLY), starts, rows, params))
        return self._made


class RequestTables:
    """A rank's copy of each running request's block table and sampling parameters, kept
    from step to step: a request holds one row of `tables` while it runs, and a step
    writes only the block ids its message appends (once every block_size decode steps).
    `argmax_only[row]`: the request's token is the argmax of its logits (greedy, nothing
    else asked), written when its parameters arrive, so that a step's sampler is chosen
    with one array read instead of a pass over its requests' parameters."""

    def __init__(self, rows: int = 64, width: int = 64):
        self.tables = np.zeros((rows, width), np.int32)  # row -> block ids, 0-padded
        self.lengths = np.zeros(rows, np.int32)  # row -> its number of blocks
        self.argmax_only = np.zeros(rows, bool)
        self.row_of: dict[str, int] = {}
        self.params: dict[str, SamplingParams] = {}
        self._free = list(range(rows - 1, -1, -1))

    def apply(self, batch: StepBatch) -> list[SeqChunk]:
        """The step's chunks, its rows and parameters resolved (DecodeChunks for a step of
        plain decodes only)."""
        for request_id in batch.finished_request_ids:
            self.forget(request_id)
        self.params.update(batch.new_params)
        deltas, row_of, params = batch.chunks, self.row_of, self.params
        for request_id in batch.new_params:  # of a request that kept its row (new: below)
            if request_id in row_of:
                self._mark_argmax_only(request_id, row_of[request_id])
        ids = batch.decode_ids  # requests with a row, and their parameters, already
        decode_rows = list(map(row_of.__getitem__, ids))
        for i, block_ids in batch.decode_new_blocks.items():
            self._write(decode_rows[i], batch.decode_blocks[i], block_ids)
        decode_params = list(map(params.__getitem__, ids))
        if not deltas and batch.token_masks is None:
            return DecodeChunks(ids, decode_rows, batch.decode_starts, decode_params)
        chunks = list(map(SeqChunk, ids, repeat(PLACEHOLDER_ONLY), batch.decode_starts,
                          decode_rows, decode_params))
        rows = list(map(row_of.get, map(_REQUEST_ID, deltas)))
        if None in rows:
            rows = [self._take_row(d.request_id) if row is None else row
                    for d, row in zip(deltas, rows)]
        lengths = self.lengths.tolist()  # (rows are taken: every row is in it)
        for d, row in zip(deltas, rows):
            if d.new_blocks or d.blocks_from != lengths[row]:
                self._write(row, d.blocks_from, d.new_blocks)
            chunks.append(SeqChunk(d.request_id, d.token_ids, d.start_pos, row,
                                   params[d.request_id] if d.samples else None, None,
                                   d.samples or 1))
        if batch.token_masks is not None:
            masks = batch.token_masks
            for k, (i, mask) in enumerate(zip(masks.chunks, masks.bitmask)):
                if chunks[i].num_samples > 1:  # a verification: a row per position
                    if k == 0 or masks.chunks[k - 1] != i:
                        chunks[i].token_mask = masks.bitmask[k:k + chunks[i].num_samples]
                else:
                    chunks[i].token_mask = mask
        return chunks

    def forget(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        self.params.pop(request_id, None)
        if row is not None:
            self.tables[row, :self.lengths[row]] = 0
            self.lengths[row] = 0
            self.argmax_only[row] = False
            self._free.append(row)

    def table(self, row: int) -> list[int]:
        return self.tables[row, :self.lengths[row]].tolist()

    def free_rows(self) -> list[int]:
        return list(self._free)

    def _take_row(self, request_id: str) -> int:
        if not self._free:
            rows = len(self.lengths)
            self._resize(2 * rows, self.tables.shape[1])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        row = self.row_of[request_id] = self._free.pop()
        self._mark_argmax_only(request_id, row)
        return row

    def _mark_argmax_only(self, request_id: str, row: int) -> None:
        params = self.params.get(request_id)
        self.argmax_only[row] = params is not None and params.argmax_only

    def _write(self, row: int, start: int, block_ids: list[int]) -> None:
        end = start + len(block_ids)
        if end > self.tables.shape[1]:
            self._resize(len(self.lengths), max(end, 2 * self.tables.shape[1]))
        self.tables[row, start:end] = block_ids
        self.tables[row, end:self.lengths[row]] = 0
        self.lengths[row] = end

    def _resize(self, rows: int, width: int) -> None:
        tables, lengths = self.tables, self.lengths
        self.tables = np.zeros((rows, width), np.int32)
        self.tables[:tables.shape[0], :tables.shape[1]] = tables
        self.lengths = np.zeros(rows, np.int32)
        self.lengths[:len(lengths)] = lengths
        self.argmax_only = np.resize(self.argmax_only, rows)
        self.argmax_only[len(lengths):] = False
