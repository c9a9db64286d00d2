"""A request's token state as the scheduler and the block manager see it."""
import enum
import itertools
import time

from parashift.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class Sequence:
    """One request. Invariant the scheduler works on: `num_computed_tokens`
    catches up with `num_tokens` (prompt + generated); a step computes
    `num_tokens - num_computed_tokens` tokens or a chunk of them."""

    _arrival_counter = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 priority: int = 0, prompt: str | None = None, arrival_time: float | None = None):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.priority = priority
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.arrival_index = next(self._arrival_counter)
        self.token_ids: list[int] = list(prompt_token_ids)
        # One list for every RequestOutput of the request: slicing token_ids each step costs
        # ~3 µs per sequence at a 4096-token prompt.
        self._prompt_token_ids = self.token_ids[:]
        self.num_prompt_tokens = len(prompt_token_ids)
        # While it runs, its counters live in its scheduler's RunningTable, at `slot`
        self.table, self.slot = None, -1
        self._computed = 0
        self._pending = 0  # sampled by steps in flight, not yet appended
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first schedule
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hashes of this sequence's full blocks, in order
        self.status = SequenceStatus.WAITING
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.first_token_time: float | None = None
        # Tokens (prompt + output) at which it ends by length: max_tokens' or the model's
        # length, whichever comes first (set by the scheduler that takes it)
        self.length_limit = 0
        # Draft tokens a proposer made for its next step (speculative decoding,
        # parashift/spec_decode/): the scheduler takes them into that step's chunk
        self.spec_token_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_computed_tokens(self) -> int:
        return self._computed if self.table is None else int(self.table.computed[self.slot])

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self.table is None:
            self._computed = value
        else:
            self.table.computed[self.slot] = value

    @property
    def num_pending_tokens(self) -> int:
        """Tokens sampled by steps in flight, not yet appended."""
        return self._pending if self.table is None else int(self.table.pending[self.slot])

    @num_pending_tokens.setter
    def num_pending_tokens(self, value: int) -> None:
        if self.table is None:
            self._pending = value
        else:
            self.table.pending[self.slot] = value

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.time()
        if self.table is not None:
            self.table.tokens[self.slot] += 1
            self.table.has_first[self.slot] = True

    def sort_key(self) -> tuple:
        """Scheduling order: lower priority value first, then arrival (FCFS)."""
        return (self.priority, self.arrival_time, self.arrival_index)
