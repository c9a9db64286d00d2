"""A scheduler's running sequences' counters as columns by slot, written only when they
change (admitted, a step scheduled or applied, a block taken, finished, preempted), so
that a step of decodes is scheduled and applied with array operations instead of a
Python pass per sequence (gathering a column from the sequences each step costs what
such a pass does).

While a sequence runs, its `num_computed_tokens` and `num_pending_tokens` live in its
slot (`Sequence` reads and writes them there); the other columns mirror what the
scheduler changes: its token count, block count and hashed block count, whether it has
its first token. Its length limit and whether its parameters name stop tokens are copied
in when it takes the slot. Each taking of a slot has its own serial, so that a step's
columns can tell which of its sequences still hold the slots they had."""
import itertools

import numpy as np

COLUMNS = {"computed": np.int64, "pending": np.int64, "tokens": np.int64,
           "blocks": np.int64, "hashed": np.int64, "limit": np.int64,
           "watches": bool, "has_first": bool, "serial": np.int64}


class RunningTable:

    def __init__(self, size: int = 64):
        for name, dtype in COLUMNS.items():
            setattr(self, name, np.zeros(size, dtype))
        self.serial[:] = -1
        self._free = list(range(size - 1, -1, -1))
        self._serials = itertools.count()

    def attach(self, seq) -> None:
        """The sequence's counters into a free slot (it starts running)."""
        if seq.table is not None:
            raise RuntimeError(f"request {seq.request_id!r} already holds a running slot")
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.computed[slot], self.pending[slot] = seq.num_computed_tokens, seq.num_pending_tokens
        self.tokens[slot], self.blocks[slot] = len(seq.token_ids), len(seq.block_table)
        self.hashed[slot], self.limit[slot] = len(seq.block_hashes), seq.length_limit
        self.watches[slot] = bool(seq.params.stop_token_ids)
        self.has_first[slot] = seq.first_token_time is not None
        self.serial[slot] = next(self._serials)
        seq.table, seq.slot = self, slot

    def detach(self, seq) -> None:
        """The counters back into the sequence (it stops running); its slot is free."""
        if seq.table is not self:
            raise RuntimeError(f"request {seq.request_id!r} holds no slot of this table")
        slot = seq.slot
        seq.table, seq.slot = None, -1
        seq.num_computed_tokens = int(self.computed[slot])
        seq.num_pending_tokens = int(self.pending[slot])
        self.serial[slot] = -1
        self._free.append(slot)

    def _grow(self) -> None:
        size = len(self.computed)
        for name, dtype in COLUMNS.items():
            grown = np.zeros(2 * size, dtype)
            grown[:size] = getattr(self, name)
            setattr(self, name, grown)
        self.serial[size:] = -1
        self._free = list(range(2 * size - 1, size - 1, -1))
