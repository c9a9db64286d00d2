"""Continuous batching under a token budget, vLLM-v1 style.

One invariant: each sequence's num_computed_tokens catches up with its
num_tokens. A step gives running sequences (decodes or prefill chunks) their
tokens first, in running order, then admits waiting sequences by priority.
When the block pool runs out, the lowest-priority running sequence is
preempted: its blocks are freed and it goes back to waiting with all its tokens.
By recompute, they are computed again (often from the prefix cache); by swap (a
CPU tier's slots given), its computed tokens' KV is copied to a slot of the tier
in the step that frees its blocks and back into new blocks in the step that
resumes it, so it keeps its computed count (recompute when no slot fits).

A step's computed tokens count as computed once it is scheduled, so with async
scheduling the next step can be scheduled while this one runs: a sequence whose
sampled token is still on its way holds it as a pending token, and its next
chunk carries a placeholder for it (PLACEHOLDER_TOKEN) that the model runner
fills from the previous step's samples on the device. Where no placeholder can be
filled (the first stage of a pipeline never sees the samples), `defer_pending` leaves
such a sequence out until its token is known; its other steps may still be in flight.
Speculative decoding drafts from known tokens only: a sequence that drafts next is left
out the same way, alone (`deferred`), while the others' decodes keep their placeholders."""
import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

import numpy as np

from parashift.config import SchedulerConfig
from parashift.engine.running_table import RunningTable
from parashift.engine.sequence import Sequence, SequenceStatus
from parashift.kv.block_manager import BlockManager
from parashift.kv.tier_allocator import TierAllocator, TierSlot
from parashift.step.message import PLACEHOLDER_TOKEN, StepStateMismatch


class ScheduledSeq:
    """One sequence's part of a step: `num_new_tokens` tokens from `start_pos` (its
    num_computed_tokens when scheduled, after any prefix-cache hit); `samples`: a token is
    sampled after them (the chunk reaches the last token, pending ones included).
    `draft`: a verification step's draft tokens (speculative decoding), computed after the
    sequence's last token: a token is sampled at each of its 1 + len(draft) positions."""
    __slots__ = ("seq", "num_new_tokens", "start_pos", "samples", "draft")

    def __init__(self, seq: Sequence, num_new_tokens: int, start_pos: int,
                 samples: bool | None = None, draft: list[int] | None = None):
        self.seq, self.num_new_tokens, self.start_pos = seq, num_new_tokens, start_pos
        self.samples = (start_pos + num_new_tokens == len(seq.token_ids) + seq.num_pending_tokens
                        if samples is None else samples)
        self.draft = draft

    @property
    def num_samples(self) -> int:
        """Tokens sampled after this chunk: one at each verified position."""
        return (1 + len(self.draft) if self.draft else 1) if self.samples else 0

    def token_ids(self) -> list[int]:
        """The chunk's input tokens, with a placeholder for a pending one."""
        if self.draft:
            return self.seq.token_ids[self.start_pos:] + self.draft
        if self.start_pos == len(self.seq.token_ids) and self.num_new_tokens == 1:
            return [PLACEHOLDER_TOKEN]  # a decode step under async scheduling
        known = self.seq.token_ids[self.start_pos:self.start_pos + self.num_new_tokens]
        missing = self.num_new_tokens - len(known)
        return known + [PLACEHOLDER_TOKEN] * missing if missing else known


_NUM_NEW_TOKENS = attrgetter("num_new_tokens")
_TOKEN_IDS = attrgetter("token_ids")


@dataclass(frozen=True)
class SwapOp:
    """A request's first `num_tokens` tokens' KV between these blocks and its tier slot."""
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    slot: TierSlot


@dataclass
class DecodeColumns:
    """A step's decodes in columns: each of `seqs` computes one token, a placeholder for
    its pending one, at `starts` (its token count when scheduled), and samples; `slots`
    and `serials` are the running-table slots they held when scheduled."""
    seqs: list[Sequence]
    starts: np.ndarray
    slots: np.ndarray
    serials: np.ndarray

    def __len__(self) -> int:
        return len(self.seqs)

    def as_scheduled(self) -> list[ScheduledSeq]:
        return list(map(ScheduledSeq, self.seqs, repeat(1), self.starts.tolist(), repeat(True)))


@dataclass
class SchedulerOutput:
    """A step: its decodes in columns (`decodes`), then its other chunks (`chunks`), in
    that order (the order of its rows and of its sampled tokens)."""
    chunks: list[ScheduledSeq] = field(default_factory=list)  # running first, then admitted
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[SwapOp] = field(default_factory=list)  # of preempted sequences
    swap_in: list[SwapOp] = field(default_factory=list)  # of admitted sequences
    recompute_tokens: int = 0  # computed tokens that preemptions by recompute dropped
    decodes: DecodeColumns | None = None

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        """Every chunk of the step in its order, the decodes as ScheduledSeqs too (made
        at each call)."""
        return self.decodes.as_scheduled() + self.chunks if self.decodes else self.chunks

    @property
    def num_decodes(self) -> int:
        return len(self.decodes) if self.decodes else 0

    @property
    def num_chunks(self) -> int:
        return self.num_decodes + len(self.chunks)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_decodes + sum(map(_NUM_NEW_TOKENS, self.chunks))

    @property
    def num_sampled_rows(self) -> int:
        """Tokens the ranks sample for this step: one per sampling chunk, one per verified
        position of a verification (speculative decoding)."""
        return self.num_decodes + sum(s.num_samples for s in self.chunks)

    @property
    def is_empty(self) -> bool:
        """Nothing for the ranks to do (a step with swaps out only still runs them)."""
        return not self.num_chunks and not self.swap_out


@dataclass(frozen=True)
class SchedulerCounters:
    num_waiting: int
    num_running: int
    tokens_waiting: int
    next_step_tokens: int
    priorities: tuple[int, ...]
    longest_context: int


class Scheduler:

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 eos_token_ids: set[int]):
        pool_tokens = block_manager.num_blocks * block_manager.block_size
        if pool_tokens < config.max_model_len:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the KV pool "
                             f"({pool_tokens} tokens): one sequence could never fit")
        self.config = config
        self.block_manager = block_manager
        self.eos_token_ids = set(eos_token_ids)
        self.running: list[Sequence] = []
        self.table = RunningTable()  # the running sequences' counters
        self._slots = np.zeros(0, np.int64)  # their slots, in running order
        self._waiting: list[tuple[tuple, Sequence]] = []  # heap by sort_key
        self._unfinished: dict[str, Sequence] = {}
        # What a phase may admit and run (engine/seesaw.py's SeesawGate): admits(seq),
        # runs(seq), release(seq) when the sequence leaves. None: everything.
        self.gate = None
        # The slots of the group's CPU tier that preempted sequences swap into; None: recompute.
        self.swap_slots: TierAllocator | None = None
        self.defer_pending = False  # no placeholders: a sequence waits for its pending token
        self.draft_tokens = 0  # running sequences' draft tokens for the next step
        # running sequences that wait for their pending tokens to draft (the speculator's)
        self.deferred: set[Sequence] = set()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def waiting(self) -> list[Sequence]:
        """Waiting sequences in admission order (a copy)."""
        return [seq for _, seq in sorted(self._waiting, key=lambda entry: entry[0])]

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    def most_urgent(self) -> int | None:
        """The lowest priority value among the unfinished requests (None: there are none)."""
        return min((seq.priority for seq in self._unfinished.values()), default=None)

    def counters(self) -> SchedulerCounters:
        """What a policy sees of this scheduler, with no state changes. The next step's
        tokens are an estimate: no preemption, no prefix-cache hits, no per-request cap."""
        budget, table, slots = self.config.max_num_batched_tokens, self.table, self._slots
        # (a verification's drafts count: the policy sees the step's scheduled tokens; a
        # deferred sequence's decode does not) (it runs every step) what running ones need
        tokens = min(budget, int((table.tokens[slots] + table.pending[slots]
                                  - table.computed[slots]).sum()) + self.draft_tokens
                     - len(self.deferred))
        longest = int(table.tokens[slots].max()) if len(slots) else 0
        waiting = [seq for _, seq in self._waiting]
        seats = max(0, self.config.max_num_seqs - len(self.running))
        for _, seq in heapq.nsmallest(seats, self._waiting, key=lambda entry: entry[0]):
            if tokens >= budget:
                break
            tokens += max(0, self._num_new_tokens(seq, budget - tokens, 0))
        priorities = {seq.priority for seq in self._unfinished.values()}
        return SchedulerCounters(
            len(waiting), len(self.running),
            sum(seq.num_tokens - seq.num_computed_tokens for seq in waiting), tokens,
            tuple(sorted(priorities)), longest)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._unfinished:
            raise ValueError(f"request {seq.request_id!r} is already scheduled")
        if not 0 < seq.num_tokens <= self.config.max_model_len:
            raise ValueError(f"prompt of {seq.num_tokens} tokens: must be 1 to "
                             f"max_model_len={self.config.max_model_len}")
        seq.status = SequenceStatus.WAITING
        max_tokens, max_model_len = seq.params.max_tokens, self.config.max_model_len
        seq.length_limit = max_model_len if max_tokens is None else \
            min(max_model_len, seq.num_prompt_tokens + max_tokens)
        self._unfinished[seq.request_id] = seq
        heapq.heappush(self._waiting, (seq.sort_key(), seq))

    def abort(self, request_id: str) -> Sequence | None:
        return self.finish_request(request_id, "abort")

    def finish_request(self, request_id: str, reason: str,
                       stop_reason: int | str | None = None) -> Sequence | None:
        """Finishes an unfinished request by its id; returns it (None if none is)."""
        seq = self._unfinished.get(request_id)
        if seq is not None:
            self.finish(seq, reason, stop_reason)
        return seq

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self._stop_running(seq)
        elif seq.status == SequenceStatus.WAITING:
            self._remove_waiting(seq)
        else:
            return
        self.block_manager.free(seq)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        del self._unfinished[seq.request_id]

    def evict_all(self) -> list[Sequence]:
        """Takes every unfinished sequence out of this scheduler, in scheduling order, their
        blocks freed and their computed tokens dropped (a running one is computed again
        wherever it goes next, prompt and output tokens alike). No step may be in flight."""
        if any(seq.num_pending_tokens for seq in self._unfinished.values()):
            raise RuntimeError("sequences leave a scheduler only when no step is in flight")
        evicted = sorted(self._unfinished.values(), key=Sequence.sort_key)
        for seq in self.running:
            self.table.detach(seq)
        self._slots = self._slots[:0]
        for seq in evicted:
            self.block_manager.free(seq)
            self._release(seq)
            if seq.num_computed_tokens or seq.status == SequenceStatus.RUNNING:
                seq.num_preemptions += 1
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
        self.running, self._waiting, self._unfinished = [], [], {}
        return evicted

    def evict_waiting(self) -> list[Sequence]:
        """Takes the waiting sequences out (they hold no blocks), in scheduling order; the
        running ones stay. A swapped one leaves its KV behind (it is computed again). No
        step may be in flight."""
        evicted = [seq for _, seq in sorted(self._waiting, key=lambda entry: entry[0])]
        if any(seq.num_pending_tokens for seq in evicted):
            raise RuntimeError("sequences leave a scheduler only when no step is in flight")
        for seq in evicted:
            del self._unfinished[seq.request_id]
            if self._free_swap_slot(seq):
                seq.num_computed_tokens = 0
        self._waiting = []
        return evicted

    def movable_waiting(self) -> list[Sequence]:
        """The waiting sequences another replica may take, in scheduling order: those with
        no token on its way that hold no KV (not started, or preempted with their blocks
        freed; not one in a CPU tier slot)."""
        tiers = [t for t in (self.swap_slots, getattr(self.gate, "slots", None)) if t is not None]
        return [seq for seq in self.waiting if not seq.num_pending_tokens
                and not any(seq.request_id in tier.slots for tier in tiers)]

    def take_waiting(self, seqs: list[Sequence]) -> None:
        """Takes these waiting sequences (of `movable_waiting`) out: another replica
        queues them."""
        ids = {seq.request_id for seq in seqs}
        self._waiting = [entry for entry in self._waiting if entry[1].request_id not in ids]
        heapq.heapify(self._waiting)
        for request_id in ids:
            del self._unfinished[request_id]

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        left = self._schedule_in_columns(out, budget)
        budget = self._schedule_running(out, budget) if left is None else left
        self.draft_tokens = 0
        if self.deferred:
            self.deferred = set()
        # A seq preempted in this step must not be re-admitted in the same step.
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def update(self, output: SchedulerOutput, sampled: list[int] | dict[str, int]
               ) -> list[Sequence]:
        """Apply a step's results (`sampled`: the token of each chunk that samples, in
        order (a list of accepted tokens where the chunk verified a draft), or by request
        id); return the sequences it finished. A sequence preempted since the step was
        scheduled still takes its sampled tokens."""
        if isinstance(sampled, dict):
            sampled = [sampled.get(s.seq.request_id) for s in output.scheduled if s.samples]
        n, finished = output.num_decodes, []
        if n:
            self._update_decodes(output.decodes, sampled[:n], finished)
        tokens = iter(sampled[n:] if n else sampled)
        for scheduled in output.chunks:
            if scheduled.draft:
                self._take_verified(scheduled, next(tokens), finished)
            else:
                self._take_result(scheduled, next(tokens) if scheduled.samples else None,
                                  finished)
        return finished

    def _take_verified(self, scheduled: ScheduledSeq, tokens: list[int],
                       finished: list[Sequence]) -> None:
        """A verification's accepted tokens (the accepted draft and the target's next),
        appended one by one until one stops the sequence. Its computed tokens fall back to
        the positions whose inputs were accepted: the rejected drafts' KV slots are written
        over by the next step, and only blocks of verified tokens are cached."""
        seq = scheduled.seq
        if seq.status is SequenceStatus.FINISHED:
            return
        running = seq.status is SequenceStatus.RUNNING
        seq.num_pending_tokens -= 1
        table = self.table
        for token in tokens:
            seq.token_ids.append(token)
            if running:
                table.tokens[seq.slot] += 1
            reason, stop_reason = self._check_stop(seq)
            if reason is not None:
                break
        if seq.first_token_time is None:
            seq.first_token_time = time.time()
        verified = len(seq.token_ids) - 1
        if seq.num_computed_tokens > verified:
            seq.num_computed_tokens = verified
        if running:
            table.has_first[seq.slot] = True
            if self.block_manager.enable_prefix_caching and \
                    verified // self.block_manager.block_size > len(seq.block_hashes):
                self.block_manager.cache_full_blocks(seq, verified)
                table.hashed[seq.slot] = len(seq.block_hashes)
            if reason is not None:
                self.finish(seq, reason, stop_reason)
                finished.append(seq)

    def _take_result(self, scheduled: ScheduledSeq, token: int | None,
                     finished: list[Sequence]) -> None:
        """One chunk's result: its computed blocks cached, its token appended (if it
        sampled), the sequence finished (into `finished`) if the token stops it."""
        seq = scheduled.seq
        status = seq.status
        if status is SequenceStatus.FINISHED:  # aborted (or stopped) while the step ran
            return
        running = status is SequenceStatus.RUNNING
        block_manager = self.block_manager
        if running and block_manager.enable_prefix_caching:
            computed = min(scheduled.start_pos + scheduled.num_new_tokens, len(seq.token_ids))
            if computed // block_manager.block_size > len(seq.block_hashes):  # a block filled
                block_manager.cache_full_blocks(seq, computed)
                self.table.hashed[seq.slot] = len(seq.block_hashes)
        if not scheduled.samples:
            return
        seq.num_pending_tokens -= 1
        seq.token_ids.append(token)
        if running:
            self.table.tokens[seq.slot] += 1
            self.table.has_first[seq.slot] = True
        if seq.first_token_time is None:
            seq.first_token_time = time.time()
        params = seq.params
        if len(seq.token_ids) < seq.length_limit and not params.stop_token_ids \
                and (params.ignore_eos or token not in self.eos_token_ids):
            return  # _check_stop's common answer, without the call
        reason, stop_reason = self._check_stop(seq)
        if reason is not None:
            self.finish(seq, reason, stop_reason)
            finished.append(seq)

    def _update_decodes(self, decodes: DecodeColumns, sampled: list[int],
                        finished: list[Sequence]) -> None:
        """`update` of a step's decodes with array operations. Python runs for a block that
        filled up, a first token, a sequence its token may stop, and one that no longer
        holds its slot (finished or preempted while the step ran: `_take_result`)."""
        table, block_manager = self.table, self.block_manager
        slots, starts, seqs, taken = decodes.slots, decodes.starts, decodes.seqs, sampled
        held = table.serial[slots] == decodes.serials
        rows = None if held.all() else np.flatnonzero(held)
        if rows is not None:
            kept = rows.tolist()
            seqs, taken = [seqs[i] for i in kept], [sampled[i] for i in kept]  # (the ints)
            slots, starts = slots[rows], starts[rows]
        counts = table.tokens[slots]  # before this step's tokens
        if block_manager.enable_prefix_caching:
            computed = np.minimum(starts + 1, counts)
            filled = np.flatnonzero(computed // block_manager.block_size > table.hashed[slots])
            for i in filled.tolist():
                block_manager.cache_full_blocks(seqs[i], int(computed[i]))
                table.hashed[slots[i]] = len(seqs[i].block_hashes)
        table.pending[slots] -= 1
        counts += 1
        table.tokens[slots] = counts
        deque(map(list.append, map(_TOKEN_IDS, seqs), taken), maxlen=0)
        has_first = table.has_first[slots]
        if not has_first.all():
            now = time.time()
            for i in np.flatnonzero(~has_first).tolist():
                seqs[i].first_token_time = now
            table.has_first[slots] = True
        may_stop = (counts >= table.limit[slots]) | table.watches[slots]
        if not self.eos_token_ids.isdisjoint(taken):  # (one C pass: most steps sample none)
            may_stop |= np.isin(np.array(taken), list(self.eos_token_ids))
        visits = np.flatnonzero(may_stop)
        if rows is not None:
            visits = sorted(rows[visits].tolist() + np.flatnonzero(~held).tolist())
        for i in visits if rows is not None else visits.tolist():
            seq = decodes.seqs[i]
            if not held[i]:
                self._take_result(ScheduledSeq(seq, 1, int(decodes.starts[i]), True),
                                  sampled[i], finished)
                continue
            reason, stop_reason = self._check_stop(seq)
            if reason is not None:
                self.finish(seq, reason, stop_reason)
                finished.append(seq)

    def _num_new_tokens(self, seq: Sequence, budget: int, num_computed: int) -> int:
        pending = seq.num_pending_tokens
        # a pending token that reaches the length limit leaves nothing to compute after it
        if pending and (self.defer_pending or len(seq.token_ids) + pending >= seq.length_limit
                        or seq in self.deferred):
            return 0
        num_new = len(seq.token_ids) + pending - num_computed
        if num_new > budget:  # without chunked prefill, a prompt waits for a step that holds it
            num_new = budget if self.config.enable_chunked_prefill else 0
        threshold = self.config.long_prefill_token_threshold
        return num_new if threshold <= 0 or num_new <= threshold else threshold

    def _schedule_in_columns(self, out: SchedulerOutput, budget: int) -> int | None:
        """The running sequences' step with array operations where the budget and the free
        blocks cover every one of them (so that no allocation fails and no chunk is cut
        short: what `_schedule_running`'s loop gives, block ids included). Decodes (one
        token, a placeholder for the pending one) go in columns; Python runs only for a
        chunk of another kind and a decode that takes a block, in running order. Returns
        the budget left, or None where the loop must run (a gate, too little room)."""
        running = self.running
        if self.gate is not None or not running or self.draft_tokens:
            return None
        table, slots, block_size = self.table, self._slots, self.block_manager.block_size
        computed, pending, tokens = table.computed[slots], table.pending[slots], table.tokens[slots]
        blocks = table.blocks[slots]
        end = tokens + pending  # the tokens this step may reach
        waits = (pending > 0) & (self.defer_pending | (end >= table.limit[slots]))
        if self.deferred:
            waits |= np.isin(slots, [seq.slot for seq in self.deferred if seq.table is table])
        decodes = ~waits & (end == computed + 1) & (computed == tokens)
        others = np.flatnonzero(~waits & ~decodes & (end > computed)).tolist()
        takes_block = decodes & (computed >= blocks * block_size)
        needs, fresh = {}, int(takes_block.sum())
        for i in others:  # each chunk as the loop would cut it with the budget to spare
            needs[i] = num_new = self._num_new_tokens(running[i], budget, int(computed[i]))
            fresh += max(0, self.block_manager.num_blocks_for(int(computed[i]) + num_new)
                         - int(blocks[i]))
        count = int(decodes.sum())
        spent = count + sum(needs.values())
        if spent > budget or fresh > self.block_manager.num_free_blocks:
            return None
        allocate = self.block_manager.allocate_slots
        for i in sorted(others + np.flatnonzero(takes_block).tolist()):
            seq, num_new = running[i], needs.get(i, 1)
            if computed[i] + num_new > blocks[i] * block_size:
                allocate(seq, num_new)  # cannot fail: the free blocks were counted
                table.blocks[slots[i]] = len(seq.block_table)
            if i in needs:
                entry = ScheduledSeq(seq, num_new, int(computed[i]))
                out.chunks.append(entry)
                seq.num_computed_tokens = int(computed[i]) + num_new
                seq.num_pending_tokens += entry.samples
        if count == len(running):  # every one decodes (`slots` is replaced, never written)
            self._take_decodes(out, list(running), computed, slots)
        elif count:
            rows = np.flatnonzero(decodes)
            self._take_decodes(out, list(map(running.__getitem__, rows.tolist())),
                               computed[rows], slots[rows])
        return budget - spent

    def _take_decodes(self, out: SchedulerOutput, seqs: list[Sequence], starts: np.ndarray,
                      slots: np.ndarray) -> None:
        table = self.table
        table.computed[slots] += 1
        table.pending[slots] += 1
        out.decodes = DecodeColumns(seqs, starts, slots, table.serial[slots])

    def check_table(self) -> None:
        """Debug (`check_step_state`): the running table's columns against the values the
        running sequences give, from scratch."""
        table = self.table
        if len(self._slots) != len(self.running):
            raise StepStateMismatch(f"running table: {len(self._slots)} slots for "
                                    f"{len(self.running)} running sequences")
        for seq, slot in zip(self.running, self._slots.tolist()):
            if seq.table is not table or seq.slot != slot:
                raise StepStateMismatch(f"running table: request {seq.request_id!r} holds "
                                        f"slot {seq.slot}, the running order slot {slot}")
            expected = {"tokens": len(seq.token_ids), "blocks": len(seq.block_table),
                        "hashed": len(seq.block_hashes), "limit": seq.length_limit,
                        "watches": bool(seq.params.stop_token_ids),
                        "has_first": seq.first_token_time is not None}
            held = {name: getattr(table, name)[slot].item() for name in expected}
            if held != expected:
                raise StepStateMismatch(f"running table of request {seq.request_id!r}: "
                                        f"{held} held, {expected} from its sequence")

    def _start_running(self, seq: Sequence) -> None:
        self.running.append(seq)
        self.table.attach(seq)
        self._slots = np.append(self._slots, seq.slot)

    def _stop_running(self, seq: Sequence) -> None:
        index = self.running.index(seq)
        del self.running[index]
        self._slots = np.delete(self._slots, index)
        self.table.detach(seq)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """`allocate_slots` runs only for a sequence whose chunk needs another block: this
        loop runs over every running sequence each step. A decode (one token to compute,
        the last: computed + 1 == tokens + pending) is told apart without the calls a
        chunk of a prompt makes."""
        i, running, scheduled = 0, self.running, out.chunks
        allocate, block_size = self.block_manager.allocate_slots, self.block_manager.block_size
        gate, defer, deferred = self.gate, self.defer_pending, self.deferred
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            pending = seq.num_pending_tokens
            end = len(seq.token_ids) + pending  # the tokens this step may reach
            draft = None
            if end == computed + 1 and not (pending and (defer or end >= seq.length_limit
                                                         or seq in deferred)):
                num_new, samples = 1, True  # _num_new_tokens' answer for a decode
                if seq.spec_token_ids and not pending:  # a verification: the draft's too
                    draft, seq.spec_token_ids = seq.spec_token_ids[:budget - 1], []
                    num_new += len(draft)
            else:
                num_new, samples = self._num_new_tokens(seq, budget, computed), None
            if num_new <= 0 or (gate is not None and not gate.runs(seq)):
                i += 1
                continue
            if computed + num_new > len(seq.block_table) * block_size:
                while not allocate(seq, num_new):
                    victim = max(self.running, key=Sequence.sort_key)
                    if self.running.index(victim) < i:
                        i -= 1
                    budget += self._preempt(victim, out)
                    if victim is seq:
                        return budget
                self.table.blocks[seq.slot] = len(seq.block_table)
            entry = ScheduledSeq(seq, num_new, computed, samples, draft)
            scheduled.append(entry)
            seq.num_computed_tokens = computed + num_new
            seq.num_pending_tokens += entry.samples
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self._waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._waiting[0][1]
            if seq.num_pending_tokens:  # preempted with a token on its way: admit it once known
                return
            if self.gate is not None and not self.gate.admits(seq):
                return
            computed_blocks, num_cached = self._resume_point(seq)
            num_new = self._num_new_tokens(seq, budget, num_cached)
            if num_new <= 0:
                return
            if not self.block_manager.allocate_slots(seq, num_new, computed_blocks):
                return
            heapq.heappop(self._waiting)
            seq.num_computed_tokens = num_cached
            self._swap_in(seq, out)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self._start_running(seq)
            scheduled = ScheduledSeq(seq, num_new, num_cached)
            out.chunks.append(scheduled)
            seq.num_computed_tokens = num_cached + num_new
            seq.num_pending_tokens += scheduled.samples
            budget -= num_new

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Send a running seq back to waiting; return the budget it gives back
        if it was already scheduled in this step."""
        self._stop_running(seq)
        given_back = 0
        for k, scheduled in enumerate(out.chunks):
            if scheduled.seq is seq:
                given_back = out.chunks.pop(k).num_new_tokens
                seq.num_computed_tokens = scheduled.start_pos  # as it was before this step
                seq.num_pending_tokens -= scheduled.samples
                break
        if not self._swap_out(seq, out):
            out.recompute_tokens += seq.num_computed_tokens
            seq.num_computed_tokens = 0
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        heapq.heappush(self._waiting, (seq.sort_key(), seq))
        out.preempted.append(seq)
        return given_back

    def _resume_point(self, seq: Sequence) -> tuple[list[int], int]:
        """The cached blocks a waiting sequence starts with and its computed tokens after
        them: a swapped one's computed tokens (their pages come with its new blocks), else
        its prefix-cache hit (none for one that asks for prompt logprobs, as vLLM)."""
        if self.swap_slots is not None and seq.request_id in self.swap_slots.slots:
            return [], seq.num_computed_tokens
        if seq.params.prompt_logprobs is not None:  # every prompt position is computed
            return [], 0
        return self.block_manager.get_computed_blocks(seq)

    def _swap_out(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Takes a slot for a preempted sequence's computed tokens, whose KV this step copies
        out of its blocks; False when there is no tier, nothing computed or no room."""
        computed = seq.num_computed_tokens
        if self.swap_slots is None or computed == 0:
            return False
        slot = self.swap_slots.allocate(seq.request_id, computed)
        if slot is None:
            return False
        blocks = seq.block_table[:self.block_manager.num_blocks_for(computed)]
        out.swap_out.append(SwapOp(seq.request_id, tuple(blocks), computed, slot))
        return True

    def _swap_in(self, seq: Sequence, out: SchedulerOutput) -> None:
        """A swapped sequence just admitted: this step copies its KV from its slot into its
        new blocks, and the slot is free for the steps after it."""
        slot = self.swap_slots.slots.get(seq.request_id) if self.swap_slots is not None else None
        if slot is None:
            return
        computed = seq.num_computed_tokens
        blocks = seq.block_table[:self.block_manager.num_blocks_for(computed)]
        out.swap_in.append(SwapOp(seq.request_id, tuple(blocks), computed, slot))
        self.swap_slots.free(seq.request_id)

    def _free_swap_slot(self, seq: Sequence) -> bool:
        return self.swap_slots is not None and self.swap_slots.free(seq.request_id) > 0

    def _release(self, seq: Sequence) -> None:
        """What a sequence holds besides its blocks, when it leaves."""
        if self.gate is not None:
            self.gate.release(seq)
        self._free_swap_slot(seq)

    def _remove_waiting(self, seq: Sequence) -> None:
        self._waiting = [entry for entry in self._waiting if entry[1] is not seq]
        heapq.heapify(self._waiting)

    def _check_stop(self, seq: Sequence) -> tuple[str | None, int | None]:
        token, params = seq.token_ids[-1], seq.params
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop", None
        if params.stop_token_ids and token in params.stop_token_ids:
            return "stop", token
        if len(seq.token_ids) >= seq.length_limit:  # max_tokens or max_model_len
            return "length", None
        return None, None
