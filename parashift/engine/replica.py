"""One replica as the engine sees it, and its view for policies."""
import time
from collections import deque
from operator import attrgetter

import numpy as np

from parashift.config import SchedulerConfig
from parashift.engine.policy import GroupView
from parashift.engine.scheduler import Scheduler, SchedulerOutput, SwapOp
from parashift.kv.block_manager import BlockManager
from parashift.step.encoder import DeltaEncoder
from parashift.step.message import KVSwap, StepBatch

_REQUEST_ID = attrgetter("request_id")

ARRIVAL_WINDOW_S = 10.0  # the window of a group's arrival rate


class Replica:
    """One replica as the engine sees it (a DP replica, or one of a PP group's
    replicas): its own view of the ranks' block pool, scheduler and steps in flight.
    Its block ids start at `block_offset` in the ranks' pool.

    A replica serves a group of the node layout (`group`), or, once a merge or split
    took its ranks into other groups, finishes the requests it holds in the plan they
    were written in (`left_plan`: the KV adaptor), admitting none."""

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig, eos_ids: set[int],
                 block_offset: int = 0, group: int | None = 0, ranks: tuple[int, ...] = (0,)):
        self.block_manager = block_manager
        self.group = group  # its group in the node layout; None once left behind
        self.ranks = ranks
        self.left_plan: str | None = None  # the plan it runs once left behind
        self.yields = False  # left behind, it waits while its ranks serve more urgent requests
        self.scheduler = Scheduler(config, block_manager, eos_ids)
        self.in_flight: deque[tuple[SchedulerOutput, str, float]] = deque()  # oldest first
        self._last_finish = 0.0
        self.arrivals: deque[float] = deque()  # when requests were added, for the arrival rate
        self.last_plan = ""
        self.encoder = DeltaEncoder(block_offset)  # what this replica's ranks already know
        self.num_structured = 0  # its unfinished requests with structured output
        self.swap_space = None  # its group's CPU tier (engine/swap.py) under swap preemption

    @property
    def is_left_behind(self) -> bool:
        return self.group is None

    def leave(self, plan: str, yields: bool) -> None:
        """Its group merged or split: it finishes its requests under `plan`, between the
        new groups' steps, or (`yields`: hard preemption) while they have no request more
        urgent than its own."""
        self.group, self.left_plan, self.yields = None, plan, yields

    def rejoin(self, group: int) -> None:
        """A group of the new layout runs the plan its requests were written in."""
        self.group, self.left_plan, self.yields = group, None, False

    @property
    def load(self) -> int:
        return self.scheduler.num_running + self.scheduler.num_waiting

    def start(self, sched: SchedulerOutput, plan: str) -> None:
        self.in_flight.append((sched, plan, time.perf_counter()))
        self.last_plan = plan

    def view(self, now: float, window_s: float = ARRIVAL_WINDOW_S) -> GroupView:
        while self.arrivals and self.arrivals[0] < now - window_s:
            self.arrivals.popleft()
        c, blocks = self.scheduler.counters(), self.block_manager
        return GroupView(self.last_plan, c.num_waiting, c.num_running, c.tokens_waiting,
                         c.next_step_tokens, blocks.num_blocks - blocks.num_free_blocks,
                         blocks.num_free_blocks, c.priorities, c.longest_context,
                         len(self.arrivals) / window_s)

    def finish(self) -> tuple[SchedulerOutput, str, float]:
        """The oldest step in flight, its plan, and its time on the device (from its
        submission or the previous step's end, whichever is later)."""
        sched, plan, started = self.in_flight.popleft()
        now = time.perf_counter()
        seconds, self._last_finish = now - max(started, self._last_finish), now
        return sched, plan, seconds

    def step_batch(self, sched: SchedulerOutput, plan: str) -> StepBatch:
        """The step's message. Its decodes go first, in columns (StepBatch): the
        scheduler's (`sched.decodes`), then those among its other chunks, and
        `sched.chunks` is put in the message's order, that of the sampled tokens."""
        for seq in sched.preempted:
            self.encoder.reset(seq.request_id)
        decode_ids, decode_starts, decode_blocks, decode_new = self._decode_columns(sched)
        chunks, new_params, prompts, others = [], {}, {}, []
        encoder = self.encoder
        sent_blocks, chunk = encoder.sent_blocks, encoder.chunk
        for i, s in enumerate(sched.chunks):
            seq = s.seq
            request_id, block_table, start = seq.request_id, seq.block_table, s.start_pos
            sent = sent_blocks.get(request_id)
            if s.num_new_tokens == 1 and start == len(seq.token_ids) and sent is not None:
                if sent != len(block_table):  # a decode that starts a block (they sample)
                    decode_new[len(decode_ids)] = encoder.new_blocks(request_id, block_table)
                decode_ids.append(request_id)
                decode_starts.append(start)
                decode_blocks.append(sent)
                continue
            if sent is None:
                new_params[request_id] = seq.params
                if seq.params.uses_history or seq.params.prompt_logprobs is not None:
                    prompts[request_id] = seq.prompt_token_ids
            chunks.append(chunk(request_id, s.token_ids(), start, block_table, s.num_samples))
            others.append(i)
        if others and others[0] != len(decode_ids) - sched.num_decodes:  # a chunk first
            _decodes_first(sched, others)
        batch = StepBatch(chunks, new_params, self.encoder.take_finished(), plan, prompts,
                          decode_ids=decode_ids, decode_starts=decode_starts,
                          decode_blocks=decode_blocks, decode_new_blocks=decode_new)
        if sched.swap_out or sched.swap_in:
            batch.swap_out = [self._kv_swap(op) for op in sched.swap_out]
            batch.swap_in = [self._kv_swap(op) for op in sched.swap_in]
            batch.swap_tier_path, batch.swap_tier_tokens = self.swap_space.path, self.swap_space.tokens
        return batch

    def _decode_columns(self, sched: SchedulerOutput):
        """The message's columns of the scheduler's decodes: request ids, start positions,
        the blocks the ranks hold of each and the new ones of those that took a block. A
        decode whose request the ranks do not know (moved here) goes as a chunk."""
        decodes = sched.decodes
        if not decodes:
            return [], [], [], {}
        ids = list(map(_REQUEST_ID, decodes.seqs))
        sent = list(map(self.encoder.sent_blocks.get, ids))
        if None in sent:
            sched.chunks[:0] = decodes.as_scheduled()
            sched.decodes = None
            return [], [], [], {}
        blocks = self.scheduler.table.blocks[decodes.slots]
        new = {i: self.encoder.new_blocks(ids[i], decodes.seqs[i].block_table)
               for i in np.flatnonzero(blocks != np.array(sent)).tolist()}
        return ids, decodes.starts.tolist(), sent, new

    def _kv_swap(self, op: SwapOp) -> KVSwap:
        """A swap as the ranks see it: its blocks in their pool's ids."""
        offset = self.encoder.block_offset
        return KVSwap(op.request_id, [b + offset for b in op.block_ids], op.num_tokens,
                      op.slot.start, op.slot.length)


def _decodes_first(sched: SchedulerOutput, others: list[int]) -> None:
    """Reorders the scheduled sequences: the plain decodes, then the others (at these
    indices), each in its order."""
    scheduled, other = sched.chunks, set(others)
    sched.chunks = [s for i, s in enumerate(scheduled) if i not in other] + \
        [scheduled[i] for i in others]


def combine_views(views: list[GroupView]) -> GroupView:
    """One group's view from the views of its replicas: counts and rates added up, sizes
    and times the most of one, its measured prompt rate the least of one."""
    if len(views) == 1:
        return views[0]
    added = {name: sum(getattr(v, name) for v in views) for name in (
        "num_waiting", "num_running", "tokens_waiting", "next_step_tokens", "kv_blocks_used",
        "kv_blocks_free", "arrival_rate", "recompute_tokens", "prompt_tokens_left")}
    most = {name: max(getattr(v, name) for v in views) for name in (
        "longest_context", "cpu_tier_fill", "cpu_tier_free_run", "next_prompt_tokens",
        "kv_capacity", "longest_need", "longest_decode_left", "step_s", "waiting_decode_most")}
    rates = [v.prefill_tokens_per_s for v in views if v.prefill_tokens_per_s > 0]
    return GroupView(views[0].plan, **added, **most,
                     priorities=tuple(sorted({p for v in views for p in v.priorities})),
                     prefill_tokens_per_s=min(rates, default=0.0))
