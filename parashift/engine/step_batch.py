"""What the model runner needs of one step, as plain data (no Sequence objects),
so that it can later travel to worker processes unchanged."""
from dataclasses import dataclass, field

from parashift.sampling_params import SamplingParams


@dataclass
class SeqChunk:
    request_id: str
    token_ids: list[int]       # the tokens computed this step
    start_pos: int             # position of token_ids[0]
    block_table: list[int]
    sampling: SamplingParams | None  # set when a token is sampled after this chunk

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class StepBatch:
    chunks: list[SeqChunk]
    finished_request_ids: list[str] = field(default_factory=list)  # runner may drop their state

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def sampling_chunks(self) -> list[SeqChunk]:
        return [c for c in self.chunks if c.sampling is not None]
