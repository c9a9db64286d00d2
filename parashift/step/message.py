"""One step as it travels from the engine to every rank.

The message carries deltas: a request's sampling parameters once, and only the
block ids appended to its block table since the last step."""
from dataclasses import dataclass, field

from parashift.sampling_params import SamplingParams
from parashift.structured.matchers import TokenMasks

PLACEHOLDER_TOKEN = -1  # a token sampled by the step in flight, not yet known to the engine
# The input of every plain decode's chunk on a rank: one list, shared (read, never written)
PLACEHOLDER_ONLY = [PLACEHOLDER_TOKEN]


class StepStateMismatch(AssertionError):
    """`--check-step-state`: the persistent state of a step's either side (the scheduler's
    running table, a rank's block tables and uploads) differs from its rebuild from scratch."""


@dataclass(slots=True)
class ChunkDelta:
    request_id: str
    token_ids: list[int]       # the tokens computed this step
    start_pos: int             # position of token_ids[0]
    blocks_from: int           # new_blocks replace the block table from this index on
    new_blocks: list[int]
    samples: int               # tokens sampled at its last positions: 0, 1, or 1 + k
                              # (a verification of k draft tokens, speculative decoding)


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
