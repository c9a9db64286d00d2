"""One step as it travels from the engine to every rank, and as the model
runner sees it once the rank has applied it to what it already knows.

The message carries deltas: a request's sampling parameters once, and only the
block ids appended to its block table since the last step."""
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

import numpy as np

from parashift.sampling_params import SamplingParams
from parashift.structured.matchers import TokenMasks

_REQUEST_ID = attrgetter("request_id")
PLACEHOLDER_TOKEN = -1  # a token sampled by the step in flight, not yet known to the engine
# The input of every plain decode's chunk on a rank: one list, shared (read, never written)
PLACEHOLDER_ONLY = [PLACEHOLDER_TOKEN]


@dataclass(slots=True)
class ChunkDelta:
    request_id: str
    token_ids: list[int]       # the tokens computed this step
    start_pos: int             # position of token_ids[0]
    blocks_from: int           # new_blocks replace the block table from this index on
    new_blocks: list[int]
    samples: bool              # a token is sampled after this chunk


@dataclass(slots=True)
class KVSwap:
    """One request's KV between its pages and its slot of its group's CPU tier (swap
    preemption): its first `num_tokens` tokens, in the pool's block ids."""
    request_id: str
    block_ids: list[int]
    num_tokens: int
    slot_start: int
    slot_length: int


@dataclass
class StepBatch:
    """A step's chunks are its plain decodes, in columns (`decode_ids`, `decode_starts`,
    `decode_blocks`: one placeholder token at that position, a token sampled; the block
    table keeps its first `decode_blocks` ids, followed by `decode_new_blocks[i]` where the
    i-th has new ones), then `chunks`, in that order: the order of its rows and of its
    sampled tokens."""
    chunks: list[ChunkDelta]
    new_params: dict[str, SamplingParams] = field(default_factory=dict)
    finished_request_ids: list[str] = field(default_factory=list)
    plan: str = ""  # name of the plan this step runs under ("" = the base plan)
    # The prompt of each new request whose sampling reads its tokens (penalties): chunks
    # skip what the prefix cache holds, and the prompt tells the output tokens apart.
    prompts: dict[str, list[int]] = field(default_factory=dict)
    token_masks: TokenMasks | None = None  # structured output's masks of sampling chunks
    # A step that every replica sharing FFN weights runs together (SiDP's Compute-as-a-
    # Service): the same id on all of them, asserted by the ranks; -1: a step of its own.
    round_id: int = -1
    # Swap preemption, done at the start of the step's launch, outs before ins: KV gathered
    # from pages about to be freed, and scattered into a resumed request's new pages, through
    # the group's CPU tier (the file at swap_tier_path, of swap_tier_tokens tokens).
    swap_out: list[KVSwap] = field(default_factory=list)
    swap_in: list[KVSwap] = field(default_factory=list)
    swap_tier_path: str = ""
    swap_tier_tokens: int = 0
    # A round whose replicas all decode (a token per sequence): the most sequences one of
    # them runs, to which every replica pads its shared FFN blocks' rows, so that the
    # round's exchanges have one shape the ranks know without asking (and CUDA graphs can
    # replay them); 0: counts exchanged at the step's first FFN block.
    round_rows: int = 0
    # A round of another kind: each rank of its replicas with its replica's tokens this
    # step, the FFN rows the peers exchange (known without asking: no exchange of counts,
    # no wait for the device inside the forward); empty: counts exchanged.
    round_tokens: dict[int, int] = field(default_factory=dict)
    decode_ids: list[str] = field(default_factory=list)
    decode_starts: list[int] = field(default_factory=list)
    decode_blocks: list[int] = field(default_factory=list)
    decode_new_blocks: dict[int, list[int]] = field(default_factory=dict)

    def all_chunks(self) -> list[ChunkDelta]:
        """Every chunk of the step in its order, the plain decodes as ChunkDeltas too."""
        if not self.decode_ids:
            return self.chunks
        new = self.decode_new_blocks
        return [ChunkDelta(request_id, [PLACEHOLDER_TOKEN], start, blocks, new.get(i, []), True)
                for i, (request_id, start, blocks) in enumerate(zip(
                    self.decode_ids, self.decode_starts, self.decode_blocks))] + self.chunks


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

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


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
                                   params[d.request_id] if d.samples else None))
        if batch.token_masks is not None:
            for i, mask in zip(batch.token_masks.chunks, batch.token_masks.bitmask):
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


class DeltaEncoder:
    """The engine's side: remembers what each replica's ranks already know."""

    def __init__(self, block_offset: int = 0):
        self.block_offset = block_offset  # where this replica's block ids start in the pool
        self.sent_blocks: dict[str, int] = {}
        self.finished: list[str] = []

    def chunk(self, request_id: str, token_ids: list[int], start_pos: int,
              block_table: list[int], samples: bool) -> ChunkDelta:
        sent = self.sent_blocks.get(request_id, 0)
        return ChunkDelta(request_id, token_ids, start_pos, sent,
                          self.new_blocks(request_id, block_table), samples)

    def new_blocks(self, request_id: str, block_table: list[int]) -> list[int]:
        """The block ids the ranks do not have yet (in their pool's ids), now sent."""
        sent = self.sent_blocks.get(request_id, 0)
        count = self.sent_blocks[request_id] = len(block_table)
        if sent == count:  # most decode steps
            return []
        if self.block_offset:
            return [b + self.block_offset for b in block_table[sent:]]
        return block_table[sent:]

    def is_new(self, request_id: str) -> bool:
        return request_id not in self.sent_blocks

    def reset(self, request_id: str) -> None:
        """The request's blocks were freed (preempted): resend its table from scratch."""
        if request_id in self.sent_blocks:
            self.sent_blocks[request_id] = 0

    def drop(self, request_id: str) -> None:
        """The request moved to another replica, which tells the ranks to forget it."""
        self.sent_blocks.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        if self.sent_blocks.pop(request_id, None) is not None:
            self.finished.append(request_id)

    def take_finished(self) -> list[str]:
        finished, self.finished = self.finished, []
        return finished
