"""One step as it travels from the engine to every rank, and as the model
runner sees it once the rank has applied it to what it already knows.

The message carries deltas: a request's sampling parameters once, and only the
block ids appended to its block table since the last step."""
from dataclasses import dataclass, field

import numpy as np

from parashift.sampling_params import SamplingParams
from parashift.structured.matchers import TokenMasks

PLACEHOLDER_TOKEN = -1  # a token sampled by the step in flight, not yet known to the engine


@dataclass
class ChunkDelta:
    request_id: str
    token_ids: list[int]       # the tokens computed this step
    start_pos: int             # position of token_ids[0]
    blocks_from: int           # new_blocks replace the block table from this index on
    new_blocks: list[int]
    samples: bool              # a token is sampled after this chunk


@dataclass
class StepBatch:
    chunks: list[ChunkDelta]
    new_params: dict[str, SamplingParams] = field(default_factory=dict)
    finished_request_ids: list[str] = field(default_factory=list)
    plan: str = ""  # name of the plan this step runs under ("" = the base plan)
    # The prompt of each new request whose sampling reads its tokens (penalties): chunks
    # skip what the prefix cache holds, and the prompt tells the output tokens apart.
    prompts: dict[str, list[int]] = field(default_factory=dict)
    token_masks: TokenMasks | None = None  # structured output's masks of sampling chunks


@dataclass
class SeqChunk:
    """A chunk resolved on the rank: whole block table and sampling parameters."""
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sampling: SamplingParams | None  # set when a token is sampled after this chunk
    token_mask: np.ndarray | None = None  # the tokens its sample may take (structured output)

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


class RequestTables:
    """A rank's copy of each running request's block table and sampling parameters."""

    def __init__(self):
        self.tables: dict[str, list[int]] = {}
        self.params: dict[str, SamplingParams] = {}

    def apply(self, batch: StepBatch) -> list[SeqChunk]:
        for request_id in batch.finished_request_ids:
            self.tables.pop(request_id, None)
            self.params.pop(request_id, None)
        self.params.update(batch.new_params)
        chunks = []
        for d in batch.chunks:
            table = self.tables.setdefault(d.request_id, [])
            del table[d.blocks_from:]
            table += d.new_blocks
            chunks.append(SeqChunk(d.request_id, d.token_ids, d.start_pos, table,
                                   self.params[d.request_id] if d.samples else None))
        if batch.token_masks is not None:
            for i, mask in zip(batch.token_masks.chunks, batch.token_masks.bitmask):
                chunks[i].token_mask = mask
        return chunks


class DeltaEncoder:
    """The engine's side: remembers what each replica's ranks already know."""

    def __init__(self, block_offset: int = 0):
        self.block_offset = block_offset  # where this replica's block ids start in the pool
        self.sent_blocks: dict[str, int] = {}
        self.finished: list[str] = []

    def chunk(self, request_id: str, token_ids: list[int], start_pos: int,
              block_table: list[int], samples: bool) -> ChunkDelta:
        sent = self.sent_blocks.get(request_id, 0)
        self.sent_blocks[request_id] = len(block_table)
        new_blocks = [b + self.block_offset for b in block_table[sent:]]
        return ChunkDelta(request_id, token_ids, start_pos, sent, new_blocks, samples)

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
