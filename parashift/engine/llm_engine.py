"""The engine loop: requests in, one scheduled step at a time, outputs out."""
import dataclasses
import json
import logging
import statistics
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass

from parashift.config import EngineConfig, SchedulerConfig
from parashift.gc_tuning import restore_garbage_collector, tune_garbage_collector
from parashift.engine.faults import (FaultReport, GroupDown, lost_ranks, policy_over,
                                     root_reason)
from parashift.engine.output_processor import make_output_processor
from parashift.engine.parallel_sampling import ParentRequest, fold_children
from parashift.engine.policy import GroupView, NodeView, Policy, make_policy
from parashift.engine.policy.forced import ForcedWidth
from parashift.engine.policy.widths import (base_replicas, layout_report, layouts_by_width,
                                            width_of)
from parashift.engine.replica import Replica, combine_views
from parashift.engine.request_outputs import (Failure, Forget, NewRequest, Processed,
                                             StepTokens)
from parashift.engine.routing import (Slot, check_fits, group_capacity, max_context_by_width,
                                      need, route)
from parashift.engine.scheduler import Scheduler, SchedulerOutput
from parashift.engine.seesaw_auto import resolve_auto_plans
from parashift.engine.seesaw import PHASES, SeesawTier, make_tiers, seesaw_stats
from parashift.engine.sequence import Sequence, SequenceStatus
from parashift.engine.startup import (eos_token_ids, make_tokenizer, request_defaults,
                                      resolve_device, resolve_dtype, resolve_max_model_len,
                                      with_step_budget)
from parashift.engine.swap import PreemptionCounts, SwapSpace, swap_tokens
from parashift.engine.token_ints import TokenInts
from parashift.engine.transitions import (TransitionRecord, Transitions, changes_partition,
                                          check)
from parashift.executor.multiproc import MultiprocExecutor
from parashift.executor.uniproc import UniprocExecutor
from parashift.kv.block_manager import BlockManager
from parashift.kv.cpu_tier import TierShape
from parashift.kv.views import tokens_per_block
from parashift.deterministic.reduction import check_plans
from parashift.loader.source import load_hf_config, resolve_model
from parashift.models.moe import check_plan
from parashift.outputs import RequestOutput
from parashift.parallel.layout import coupled_groups
from parashift.parallel.plan import Plan
from parashift.sampling_params import SamplingParams
from parashift.step.message import KVSwap
from parashift.structured.matchers import NO_CONTINUATION, StructuredOutputs
from parashift.worker.model_runner import ModelRunner
from parashift.worker.worker import WorkerSpec

logger = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One replica's step: when it ended, its plan, its tokens and its wall time."""
    time: float
    replica: int
    plan: str
    num_tokens: int
    seconds: float


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    # swap preemption: requests swapped each way, their KV bytes (the whole model's), the
    # tokens the CPU tiers hold now; and the computed tokens recompute preemptions dropped
    num_swapped_out: int = 0
    num_swapped_in: int = 0
    swap_bytes_out: int = 0
    swap_bytes_in: int = 0
    swap_tokens_used: int = 0
    num_recompute_tokens: int = 0


class LLMEngine:
    def __init__(self, config: EngineConfig, offline: bool = False, output_processor=None):
        """`offline`: driven by the `LLM` class rather than a server (a larger default step
        budget on large GPUs, as vLLM gives its `LLM`). `output_processor`: one to use instead
        of the config's (an engine core's, which hands its outputs to its caller)."""
        self.config = config
        started = time.perf_counter()
        source = resolve_model(config.model, config.load_format)
        self.model_name = source.name
        self.device = resolve_device(config.device)
        hf_config = load_hf_config(source, config.trust_remote_code)
        self.tokenizer = make_tokenizer(config, source)
        self.default_sampling = request_defaults(source, config.generation_config)
        logger.info("Loading %s on %s ...", source.describe(), self.device)  # the slow part
        self.vocab_size = hf_config.vocab_size
        self.max_model_len = resolve_max_model_len(config, hf_config)
        self.config = config = with_step_budget(config, self.device, offline)
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        self.config = config = resolve_auto_plans(config, hf_config, self.dtype, self.device)
        self.layout = config.node_layout  # the starting layout: each rank's weights and KV
        self._hf_config = hf_config
        self.policy = make_policy(config, self.layout, hf_config)
        self.policy_plans = list(self.policy.plans)  # made on every rank at start-up
        self._plans_by_name = {p.name(): p for p in self.policy_plans}
        if config.deterministic:
            check_plans(hf_config, [*self.layout.plans, *self.policy_plans])
        # the plan each rank loaded its weights and laid its KV pool out for
        self._loaded = {r: plan.loaded_plan(r) for plan in self.layout.plans for r in plan.ranks}
        self._kv_heads = hf_config.num_key_value_heads
        # seesaw: each group's CPU KV tier, by its ranks; its re-shards change pipeline stages
        self.seesaw = make_tiers(config, self.layout, getattr(self.policy, "pairs", ()), hf_config,
                                 self.dtype, self._need)
        self.transitions = Transitions(stage_changes=bool(self.seesaw))
        self._epoch = 0  # transitions committed
        self._transition_records: deque[TransitionRecord] = deque(maxlen=10_000)
        self._timeline = open(config.timeline_file, "a") if config.timeline_file else None
        self._step_records: deque[StepRecord] = deque(maxlen=10_000)
        self.executor = self._start_executor(hf_config, source)
        self._finalizer = weakref.finalize(self, self.executor.shutdown)  # no orphan workers
        self._eos_ids = eos_token_ids(hf_config, self.tokenizer, source)
        self.structured = StructuredOutputs(self.tokenizer, self.vocab_size, self._eos_ids)
        self._token_ints = TokenInts(self.vocab_size)  # (before the collector freezes start-up)
        self._scheduler_config = SchedulerConfig(
            config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
            config.long_prefill_token_threshold)
        self._tier_shape = TierShape.of_model(hf_config, self.dtype)
        self.swap_spaces: dict[tuple[int, ...], SwapSpace] = {}  # by ranks (swap preemption)
        self.replicas = [self._make_replica(group, size, offset)
                         for group, offset, size in self._start_replicas()]
        self._replica_of: dict[str, Replica] = {}
        self.output_processor = output_processor or make_output_processor(
            self.tokenizer, config.output_processor, self.device.type)
        self._processor_finalizer = weakref.finalize(self, self.output_processor.close)
        self._owed: set[str] = set()  # requests handed to the processor, final output not taken
        self._aborted: set[str] = set()  # aborted requests the processor has yet to forget
        self._ready: list[RequestOutput] = []  # outputs taken from the processor, not returned
        self._parents: dict[str, ParentRequest] = {}  # requests with n or best_of > 1
        self._parent_of: dict[str, ParentRequest] = {}  # by child request id
        self._preemptions = PreemptionCounts()
        self.steps_in_flight = 2 if _async_scheduling(config, self.policy_plans) else 1
        self._unplaced: dict[str, Sequence] = {}  # requests no group holds yet (routing.py)
        self._round_id = 0  # steps that coupled groups run together (SiDP's CaS)
        # each plan's last decode step (a token per sequence), or its last step before one
        self._last_step_s: dict[str, float] = {}
        # each plan's last decode steps' seconds (the flying policy reads their median)
        self._decode_s: dict[str, deque] = {}
        self._prefill_rate: dict[str, float] = {}  # each plan's prompt tokens/s per rank
        self.layouts_by_width = layouts_by_width(base_replicas(self.layout),
                                                 set(self._plans_by_name))
        self.max_context = self._max_context()
        self.faults = FaultReport(self.layout.world_size, len(self.layout.plans))
        tune_garbage_collector()
        logger.info("Loaded %s in %.1f s", self.model_name, time.perf_counter() - started)

    def _start_executor(self, hf_config, source):
        if self.layout.world_size == 1:
            runner = ModelRunner(self.config, hf_config, source, self.device, self.dtype,
                                 self.max_model_len)
            return UniprocExecutor(runner)
        for plan in self.policy_plans:
            check_plan(plan, hf_config, self.config.moe_parallel)
        others = tuple(p for p in self.policy_plans if p not in self.layout.plans)
        spec = WorkerSpec(self.config, hf_config, source, self.layout, self.device.type,
                          self.dtype, self.max_model_len, master_port=0, other_plans=others)
        return MultiprocExecutor(spec, self.config.worker_timeout_s,
                                 self.config.worker_heartbeat_timeout_s,
                                 self.config.worker_step_timeout_s)

    def _start_replicas(self) -> list[tuple[int, int, int]]:
        """(group, first block id, number of blocks) of each replica: a group serves one,
        or, with pipeline parallelism, one per stage when each part of its ranks' pool still
        fits a whole sequence (while stage 1 runs one replica's step, stage 0 runs the next
        one's)."""
        replicas = []
        for group, plan in enumerate(self.layout.plans):
            blocks = min(self.executor.rank_blocks[r] for r in plan.ranks)
            fits = (blocks // plan.pp) * self.config.block_size >= self.max_model_len
            parts = plan.pp if fits and not self.seesaw else 1  # seesaw: its plans change PP
            replicas += [(group, k * (blocks // parts), blocks // parts) for k in range(parts)]
        return replicas

    def _make_replica(self, group: int, num_blocks: int, block_offset: int) -> Replica:
        """A replica of `group` over its ranks' pool, in the blocks its plan reads; it
        shares the blocks of its ranks with the replicas that hold requests there."""
        plan = self.layout.plans[group]
        block_size = tokens_per_block(plan, self._loaded[plan.ranks[0]], self._kv_heads,
                                      self.config.block_size)
        tier = self.seesaw.get(tuple(sorted(plan.ranks)))
        # (under seesaw a cached block may hold the other plan's layout: no prefix caching)
        blocks = BlockManager(num_blocks, block_size,
                              self.config.enable_prefix_caching and tier is None,
                              plan.ranks, block_offset)
        blocks.share([r.block_manager for r in getattr(self, "replicas", ())])
        holds = min(self.max_model_len, num_blocks * block_size)  # the layout's others may hold more
        config = dataclasses.replace(self._scheduler_config, max_model_len=holds)
        replica = Replica(blocks, config, self._eos_ids, block_offset, group, plan.ranks)
        replica.scheduler.gate = tier.gate if tier is not None else None
        if self.config.preemption_mode == "swap":
            replica.swap_space = self._swap_space(plan.ranks)
            replica.scheduler.swap_slots = replica.swap_space.slots
        return replica

    def _swap_space(self, ranks: tuple[int, ...]) -> SwapSpace:
        """The CPU tier of the group on `ranks` (made with its first replica: at start-up for
        the layout's groups), which its replicas share."""
        key = tuple(sorted(ranks))
        space = self.swap_spaces.get(key)
        if space is None:
            tokens = swap_tokens(self.config.swap_space, self._tier_shape)
            space = self.swap_spaces[key] = SwapSpace(self._tier_shape, tokens)
        return space

    def serving_replicas(self) -> list[Replica]:
        """The replicas of the layout's groups (those that admit requests)."""
        return [r for r in self.replicas if not r.is_left_behind]

    def _max_context(self, check: bool = True) -> dict[int, int]:
        """The longest context one group of each width holds (the paper's Table 2), logged;
        refuses a max_model_len that no layout holds (at start-up: `check`)."""
        pool = self.kv_tokens_by_width()
        tokens = {width: min(held, self.max_model_len) for width, held in pool.items()}
        if not check:
            return tokens
        logger.info("Max context per layout width (its groups' KV pool in tokens): %s", ", ".join(
            f"{w}: {tokens[w]} ({pool[w]}; {','.join(self.layouts_by_width[w])})" for w in tokens))
        if max(tokens.values(), default=0) < self.max_model_len:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the KV pool: the "
                             f"largest layout holds {max(tokens.values(), default=0)} tokens")
        return tokens

    def kv_tokens_by_width(self) -> dict[int, int]:
        """The KV tokens one group of each width's layout holds at most (its pool, which
        max_model_len does not cap)."""
        serving = {self.layout.plans[r.group].name(): r.block_manager.num_blocks
                   * r.block_manager.block_size for r in self.serving_replicas()}
        rank_blocks = self.executor.rank_blocks

        def capacity(plan):
            if plan.name() in serving:
                return serving[plan.name()]
            return group_capacity(plan, rank_blocks, self._loaded, self._kv_heads,
                                  self.config.block_size)
        return max_context_by_width(self.layouts_by_width, self._plans_by_name, capacity)

    @property
    def scheduler(self) -> Scheduler:
        """The first replica's scheduler (the only one without data parallelism)."""
        return self.replicas[0].scheduler

    @property
    def runner(self) -> ModelRunner:
        """The in-process model runner (single device only)."""
        if not isinstance(self.executor, UniprocExecutor):
            raise AttributeError("the model runs in worker processes under this plan")
        return self.executor.runner

    @property
    def block_manager(self) -> BlockManager:
        return self.replicas[0].block_manager

    def shutdown(self) -> None:
        if self._finalizer.alive:
            restore_garbage_collector()
        self._finalizer()
        self._processor_finalizer()
        for tier in [*self.seesaw.values(), *self.swap_spaces.values()]:
            tier.close()
        self.seesaw, self.swap_spaces = {}, {}
        if self._timeline is not None:
            self._timeline.close()
            self._timeline = None

    # ---- requests ------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    priority: int = 0) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.verify()  # it may have been changed since it was built
        self._validate_logit_bias(params)
        prompt_text, token_ids = self._tokenize(prompt)
        self._validate_prompt(token_ids)
        check_fits(need(len(token_ids), params.max_tokens, self.max_model_len), len(token_ids),
                   self.max_context, self._forced_width())
        self._check_tier_fits(need(len(token_ids), params.max_tokens, self.max_model_len))
        parent = ParentRequest(request_id, params, priority) if params.num_samples > 1 else None
        for used in [request_id, *(parent.child_ids if parent else ())]:
            if (used in self._replica_of or used in self._parents or used in self._unplaced
                    or used in self._owed):
                raise ValueError(f"request id {used!r} is already in use")
        if parent is None:
            self._add_sequence(Sequence(request_id, token_ids, params, priority, prompt_text))
            return
        self._parents[request_id] = parent
        self._parent_of.update((child, parent) for child in parent.child_ids)
        self._add_sequence(parent.child(0, token_ids, prompt_text))
        if not self.config.enable_prefix_caching:  # the siblings would gain nothing by waiting
            self._admit_siblings(parent, token_ids, prompt_text)

    def add_requests(self, requests: list[tuple], atomic: bool = False
                     ) -> list[Exception | None]:
        """Adds requests `(request_id, prompt, params, priority)`; each one's error (None:
        taken). `atomic`: the first error aborts those added before it and ends the list."""
        errors, added = [], []
        for request_id, prompt, params, priority in requests:
            try:
                self.add_request(request_id, prompt, params, priority)
            except Exception as exc:  # noqa: BLE001 - the request's, handed to its caller
                errors.append(exc)
                if atomic:
                    for earlier in added:
                        self.abort_request(earlier)
                    break
            else:
                added.append(request_id)
                errors.append(None)
        return errors

    def _check_tier_fits(self, tokens: int) -> None:
        """Under seesaw a request's KV passes through its group's CPU tier whole."""
        capacity = min((t.slots.capacity for t in self.seesaw.values()), default=tokens)
        if tokens > capacity:
            raise ValueError(f"the request may reach {tokens} tokens (prompt + max_tokens), more "
                             f"than the CPU KV tier holds ({capacity}): lower max_tokens or "
                             "raise cpu_kv_tokens")

    def _add_sequence(self, seq: Sequence, replica: Replica | None = None) -> Replica | None:
        """Queues a sequence on `replica`, by default the one routing picks; one that no
        group holds waits, unplaced, for the policy to merge one (routing.py)."""
        if replica is None or replica.is_left_behind:
            replica = self._route(seq)
        if replica is None:
            self._unplaced[seq.request_id] = seq
            self._decide_now()
            return None
        request_id, token_ids, params = seq.request_id, seq.prompt_token_ids, seq.params
        if params.structured_outputs is not None:
            self.structured.add(request_id, params.structured_outputs)
            replica.num_structured += 1
        replica.scheduler.add(seq)
        replica.arrivals.append(time.monotonic())
        self._replica_of[request_id] = replica
        # a child of a request with n > 1 reports every step: its parent folds the outputs
        every_step = params.output_kind != "final_only" or request_id in self._parent_of
        self.output_processor.submit(NewRequest(seq, every_step))
        self._owed.add(request_id)
        return replica

    def _need(self, seq: Sequence) -> int:
        return need(seq.num_prompt_tokens, seq.params.max_tokens, self.max_model_len)

    def _route(self, seq: Sequence) -> Replica | None:
        slots = [Slot(r.load, r.group, width_of(self.layout.plans[r.group]),
                      r.scheduler.config.max_model_len) for r in self.serving_replicas()]
        index = route(slots, self._need(seq), seq.priority)
        return None if index is None else self.serving_replicas()[index]

    def _place_unplaced(self) -> None:
        """Queues the unplaced requests that a group of the layout now holds; asks the
        policy again for the others."""
        for request_id, seq in list(self._unplaced.items()):
            replica = self._route(seq)
            if replica is not None:
                del self._unplaced[request_id]
                self._add_sequence(seq, replica)
        if self._unplaced:
            self._decide_now()

    def _decide_now(self) -> None:
        """Asks the policy for transitions outside a round (a request waits for one)."""
        decision = self.policy.decide(self.view())
        if decision.transitions:
            self.transitions.request(decision.transitions, self.layout, self._plans_by_name)

    def _forced_width(self) -> int | None:
        return self.policy.width if isinstance(self.policy, ForcedWidth) else None

    def set_layout(self, width: int | None) -> None:
        """Forces every aligned group of `width` replicas to merge (the groups merge or
        split to it, one at a time, while the others serve); None hands the layout back to
        the policy. Refuses a width this node cannot take, or one too narrow for a request
        it holds."""
        longest = max((self._need(seq) for seq in self._requests()), default=0)
        if width in self.max_context and longest > self.max_context[width]:
            raise ValueError(f"width {width} holds {self.max_context[width]} tokens of context; "
                             f"a request of this node needs {longest}")
        policy = self.policy.policy if isinstance(self.policy, ForcedWidth) else self.policy
        if width is None:
            self.policy = policy
            return
        forced = ForcedWidth(policy, self.layouts_by_width)
        forced.force(width)
        self.policy = forced

    def _requests(self):
        """Every request the engine holds, placed or not."""
        yield from self._unplaced.values()
        for replica in self.replicas:
            yield from replica.scheduler.running
            yield from replica.scheduler.waiting

    def layout_info(self) -> dict:
        """The current layout: its groups, whether a width is forced, and the longest
        context of each width the node can take."""
        return layout_report(self.layout, self._forced_width(), self.layouts_by_width,
                             self.max_context)

    def _validate_logit_bias(self, params: SamplingParams) -> None:
        bad = [t for t in params.logit_bias or {} if t >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias names token id {bad[0]}, which is out of vocabulary "
                             f"(size {self.vocab_size})")

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: give prompts as token ids")
            return prompt, self.tokenizer.encode(prompt) if prompt else []
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("a token-id prompt must be a list of integers")
        return None, list(prompt)

    def _validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        if len(token_ids) + 1 > self.max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens; with one generated token that "
                             f"exceeds the model's context window max_model_len={self.max_model_len}")

    def abort_request(self, request_id: str) -> None:
        parent = self._parents.pop(request_id, None)
        for child in parent.child_ids if parent is not None else ():
            self._parent_of.pop(child, None)
            self._abort_one(child)
        if parent is None:
            self._abort_one(request_id)

    def _abort_one(self, request_id: str) -> None:
        if request_id in self._owed:  # its outputs on their way are dropped
            self._owed.discard(request_id)
            self._aborted.add(request_id)
            self.output_processor.submit(Forget(request_id))
        if self._unplaced.pop(request_id, None) is not None:
            return
        replica = self._replica_of.get(request_id)
        if replica is not None and replica.scheduler.abort(request_id) is not None:
            self._release(replica, request_id)

    def check_health(self) -> None:
        """Takes the groups of ranks that died or stopped answering out of service (cheap,
        for idle loops); raises WorkerFailure once no group is left to serve."""
        self.executor.check_health()
        self._take_losses()

    # ---- fault isolation (faults.py) --------------------------------------------
    def _take_losses(self) -> None:
        """Isolates the ranks the executor lost; raises once the engine has failed."""
        if not isinstance(self.executor, MultiprocExecutor):
            return
        if self.executor.failure is not None:
            raise self.executor.failure
        lost = self.executor.take_lost()
        if lost:
            self._isolate(lost)

    def _isolate(self, lost: dict[int, str]) -> None:
        """Takes every group holding a lost rank out of the layout (its other ranks are
        killed: a communicator with a dead peer is never used again); the groups left keep
        stepping, under a policy over them alone, and take the lost groups' requests, which
        are computed again from their prompt and the tokens already generated. Raises
        WorkerFailure once no group is left."""
        stepping = [plan.ranks for plan in self.layout.plans] + [
            r.ranks for r in self.replicas if r.is_left_behind and r.in_flight] + [
            plan.shared_ffn[1] for plan in self.layout.plans if plan.shared_ffn is not None]
        gone = lost_ranks(set(lost), stepping)
        root = root_reason(lost)
        self.executor.retire(sorted(gone - set(lost)), f"taken out with its group ({root})")
        down = tuple(GroupDown(plan.name(), plan.ranks, root) for plan in self.layout.plans
                     if gone.intersection(plan.ranks))
        seqs = [seq for replica in [r for r in self.replicas if gone.intersection(r.ranks)]
                for seq in self._evict_lost(replica, gone)]
        self.layout = self.layout.without(gone)
        self.transitions.pending.clear()  # groups renumber; the policy asks again
        for replica in self.serving_replicas():
            replica.group = self.layout.group_of_rank(replica.ranks[0])
        self._drop_finished_left_behind()
        logger.error("groups %s lost (%s); %d group(s) serve on ranks %s", [g.plan for g in down],
                     root, len(self.layout.plans), sorted(self.executor.alive))
        self.faults = FaultReport(len(self.executor.alive), len(self.layout.plans),
                                  self.faults.groups_down + down, self.faults.requests_requeued)
        if not self.layout.plans:
            self.executor.fail(f"{root}; no group of the node is left to serve\n"
                               + "\n".join(self.executor.lost.values()))
        self._narrow_policy()
        for seq in sorted(seqs, key=Sequence.sort_key):
            self._requeue(seq, root)
        self._fail_unholdable(root)

    def _evict_lost(self, replica: Replica, gone: set[int]) -> list[Sequence]:
        """A lost replica's requests, their steps in flight dropped; the replica leaves
        (one left behind on surviving ranks too: `_drop_finished_left_behind` tells its
        ranks to forget the requests)."""
        for sched, _, _ in replica.in_flight:
            for scheduled in sched.scheduled:
                scheduled.seq.num_pending_tokens -= scheduled.samples
        replica.in_flight.clear()
        seqs = replica.scheduler.evict_all()
        for seq in seqs:
            replica.encoder.forget(seq.request_id)
            replica.num_structured -= seq.params.structured_outputs is not None
        if gone.issuperset(replica.ranks):
            replica.block_manager.unshare()
            self.replicas.remove(replica)
        return seqs

    def _requeue(self, seq: Sequence, root: str) -> None:
        """Queues a lost group's request on a surviving group that holds it (its stream goes
        on), or fails it naming why."""
        self._replica_of.pop(seq.request_id, None)
        target = self._route(seq)
        if target is None and self._need(seq) <= max(self.max_context.values()):
            self._unplaced[seq.request_id] = seq  # a merge of the groups left holds it
            return
        if target is None:
            self._report_failure(seq, f"{root}: no group left holds its {self._need(seq)} tokens")
            return
        target.scheduler.add(seq)
        target.num_structured += seq.params.structured_outputs is not None
        self._replica_of[seq.request_id] = target
        self.faults = dataclasses.replace(self.faults,
                                          requests_requeued=self.faults.requests_requeued + 1)

    def _fail_unholdable(self, root: str) -> None:
        """Fails the requests waiting for a merge that no width left holds."""
        longest = max(self.max_context.values())
        for seq in [s for s in self._unplaced.values() if self._need(s) > longest]:
            del self._unplaced[seq.request_id]
            self._report_failure(seq, f"{root}: no group left holds its {self._need(seq)} tokens")

    def _narrow_policy(self) -> None:
        """A policy over the groups left (a forced width is dropped), and the widths and
        context they can take."""
        made = set(self._plans_by_name)
        self.policy = policy_over(self.layout, self.config, self._hf_config, made)
        self.layouts_by_width = layouts_by_width(base_replicas(self.layout), made)
        self.max_context = self._max_context(check=False)
        logger.warning("policy over the groups left: %s (layout %s)", self.policy.name,
                       self.layout.name())

    def _report_failure(self, seq: Sequence, reason: str) -> None:
        """Ends a request with finish reason "error"; its last output comes from the output
        processor (with the text it has)."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, "error"
        self._replica_of.pop(seq.request_id, None)
        if self.structured.tracks(seq.request_id):
            self.structured.remove(seq.request_id)
        self._owed.add(seq.request_id)
        self.output_processor.submit(Failure(seq.request_id, seq.prompt, seq.prompt_token_ids,
                                             seq.output_token_ids, seq.num_cached_tokens, reason))

    def has_unfinished_requests(self) -> bool:
        """A request is unfinished until its final output has been returned."""
        return bool(self._owed) or self._has_work()

    def _has_work(self) -> bool:
        """Requests still to compute (or to place)."""
        return bool(self._unplaced) or any(r.scheduler.has_unfinished() for r in self.replicas)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        return list(ids)

    # ---- the step ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Submits steps to every replica with room (one in flight, or two with async
        scheduling), each under the plan the policy picks for it, then returns the
        outputs of whichever replicas finish first (a replica never waits for another)."""
        self._take_losses()
        self._collect()  # requests a stop string ended leave before the next schedule
        self._commit_drained_transitions()
        while self._submit_round():
            pass
        if not any(r.in_flight for r in self.replicas):
            self._collect(wait=True)  # nothing to compute: every output handed over is made
            return self._take_outputs()
        while True:
            for replica, result in self.executor.wait_any():
                sched, plan, seconds = replica.finish()
                self._record_step(self.replicas.index(replica), plan, sched, seconds)
                self._apply(replica, sched, *result)
            # once no request is left to compute, no step stays in flight (e.g. one of a
            # replica that had nothing to run, in a round of replicas that step together)
            if self._has_work() or not any(r.in_flight for r in self.replicas):
                break
        self._take_losses()
        self._drop_finished_left_behind()
        self._commit_drained_transitions()
        return self._take_outputs()

    def idle_turn(self) -> bool:
        """With nothing to run, a policy that acts when idle may change the layout now, so
        that the next request does not wait for the change in its time to first token (the
        flying policy merges an idle node before the queue builds; a forced width applies
        at once). True if the layout changed."""
        if (not getattr(self.policy, "acts_when_idle", False) or self.has_unfinished_requests()
                or any(r.in_flight for r in self.replicas)):
            return False
        before = self.layout
        for _ in range(len(self.layout.plans)):  # one merge or split a decision
            decision = self.policy.decide(self.view())
            if not decision.transitions:
                break
            self.transitions.request(decision.transitions, self.layout, self._plans_by_name)
            self._commit_drained_transitions()
        return self.layout is not before

    def _take_outputs(self) -> list[RequestOutput]:
        outputs, self._ready = self._ready, []
        return self._fold_children(outputs) if self._parent_of else outputs

    def _collect(self, wait: bool = False) -> None:
        """Takes the output processor's results (with `wait`, all of them): their outputs
        are ready to return, and the requests it ended leave the engine here, at a step
        boundary (a few more of their tokens may have been computed; it reports none)."""
        for processed in self.output_processor.take(wait):
            self._take_processed(processed)

    def _take_processed(self, processed: Processed) -> None:
        aborted = self._aborted
        for request_id, (reason, stop_reason) in processed.ended.items():
            if request_id not in aborted:
                self._end_request(request_id, reason, stop_reason)
        for output in processed.outputs:
            if output.request_id in aborted:
                continue
            if output.finished:
                self._owed.discard(output.request_id)
            self._ready.append(output)
        if processed.forgotten:
            aborted.difference_update(processed.forgotten)
        if processed.done:
            self._owed.difference_update(processed.done)

    def _end_request(self, request_id: str, reason: str, stop_reason: str | None) -> None:
        """Ends a request that the output processor ended (a stop string, or its text
        could not be made); its last output is the processor's."""
        if self._unplaced.pop(request_id, None) is not None:
            return
        replica = self._replica_of.get(request_id)
        if replica is not None:
            replica.scheduler.finish_request(request_id, reason, stop_reason)
            self._release(replica, request_id)

    def _fold_children(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        return fold_children(outputs, self._parent_of, self._parents, self.abort_request)

    def _admit_siblings(self, parent: ParentRequest, token_ids: list[int],
                        prompt_text: str | None) -> None:
        """Once the first child has computed the prompt, its blocks are in the prefix
        cache of its replica: the siblings go to the same one (where it is now: a merge or
        split may have moved it)."""
        parent.siblings_admitted = True
        replica = self._replica_of.get(parent.child_ids[0])
        for index in range(1, len(parent.child_ids)):
            self._add_sequence(parent.child(index, token_ids, prompt_text), replica)

    def _submit_round(self) -> bool:
        """Asks the policy for every group's next plan (before scheduling), then schedules
        and submits one step on each replica with room; False once none was submitted."""
        open_replicas = self._open_replicas()
        if not open_replicas:
            return False
        reads_view = getattr(self.policy, "reads_view", True)
        decision = self.policy.decide(self.view() if reads_view else NodeView(()))
        if decision.transitions:
            self.transitions.request(decision.transitions, self.layout, self._plans_by_name)
            open_replicas = self._open_replicas()
        coupled = coupled_groups([self._plans_by_name.get(name) for name in decision.plans])
        submitted = False
        for groups in coupled:
            submitted |= self._submit_together(groups, decision)
        together = {g for groups in coupled for g in groups}
        for replica in open_replicas:
            if replica.group in together:
                continue
            sched = self._schedule(replica)
            if sched.is_empty:
                if replica.scheduler.gate is not None and not replica.in_flight:
                    # its phase is stuck: the policy switches
                    replica.scheduler.gate.stalled = replica.scheduler.num_waiting > 0
                continue
            plan = self._plan_for(replica, decision)
            self.executor.submit(replica, plan.ranks, plan.output_rank(),
                                 self._step_batch(replica, sched, plan.name()))
            replica.start(sched, plan.name())
            submitted = True
        return submitted

    def _submit_together(self, groups: tuple[int, ...], decision) -> bool:
        """One step on each of `groups`' replicas, all in one round (they share FFN weights
        in Compute-as-a-Service: every rank of theirs takes part in each step), a replica
        with nothing to run included; none until each has room and one has work."""
        replicas = [r for r in self.serving_replicas() if r.group in groups]
        if (any(len(r.in_flight) >= self._steps_in_flight(r) for r in replicas)
                or not any(r.scheduler.has_unfinished() for r in replicas)):
            return False
        scheds = [self._schedule(r) for r in replicas]
        if all(sched.is_empty for sched in scheds):
            return False
        self._round_id += 1
        rows = decode_round_rows(scheds)
        tokens = {} if rows else {rank: sched.num_batched_tokens
                                  for replica, sched in zip(replicas, scheds)
                                  for rank in replica.ranks}
        for replica, sched in zip(replicas, scheds):
            plan = self._plan_for(replica, decision)
            batch = self._step_batch(replica, sched, plan.name())
            batch.round_id, batch.round_rows, batch.round_tokens = self._round_id, rows, tokens
            self.executor.submit(replica, plan.ranks, plan.output_rank(), batch)
            replica.start(sched, plan.name())
        return True

    def _open_replicas(self) -> list[Replica]:
        """Replicas with work and room for a step, none of whose ranks a pending transition
        is draining. Under hard preemption a replica left behind waits while a group on its
        ranks has a request more urgent than all of its own."""
        paused = {r for g in self.transitions.paused_groups() for r in self.layout.plans[g].ranks}
        urgency = self._urgency_by_rank() if any(r.yields for r in self.replicas) else {}
        return [r for r in self.replicas
                if len(r.in_flight) < self._steps_in_flight(r) and r.scheduler.has_unfinished()
                and paused.isdisjoint(r.ranks) and not (r.yields and self._outranked(r, urgency))]

    def _urgency_by_rank(self) -> dict[int, int]:
        """Each rank's most urgent request priority among the serving groups on it."""
        urgency = {}
        for replica in self.serving_replicas():
            priority = replica.scheduler.most_urgent()
            for rank in replica.ranks if priority is not None else ():
                urgency[rank] = min(priority, urgency.get(rank, priority))
        return urgency

    @staticmethod
    def _outranked(replica: Replica, urgency: dict[int, int]) -> bool:
        """Whether a group on the replica's ranks has a request more urgent than its own
        (a paused replica would otherwise wait as long as requests keep arriving)."""
        own = replica.scheduler.most_urgent()
        return own is not None and any(urgency.get(rank, own) < own for rank in replica.ranks)

    def _plan_for(self, replica: Replica, decision) -> "Plan":
        """The plan of the replica's next step: the policy's for its group, or the plan its
        requests were written in once it was left behind."""
        name = replica.left_plan if replica.is_left_behind else decision.plans[replica.group]
        plan = self._plans_by_name.get(name)
        if plan is None or plan.ranks != replica.ranks:
            raise ValueError(f"the policy chose plan {name!r} for group {replica.group}, "
                             f"which runs on ranks {list(replica.ranks)}")
        return plan

    def _schedule(self, replica: "Replica") -> SchedulerOutput:
        """The replica's next step. A pipeline's first stage never sees the sampled tokens
        that fill a step's placeholders: in a plan of several stages a sequence whose token
        is on its way waits for it (its scheduler defers it)."""
        replica.scheduler.defer_pending = self._stages(replica) > 1
        sched = replica.scheduler.schedule()
        if self.config.check_step_state:
            replica.scheduler.check_table()
        self._preemptions.add(sched, self._tier_shape.token_bytes)
        return sched

    def _steps_in_flight(self, replica: "Replica") -> int:
        """A structured-output request's next mask needs its last token: one step at a
        time. A replica in a plan of several stages that is its group's only one (Seesaw's
        prefill plan, or a static pipeline whose pool holds no replica per stage) keeps a
        step per stage in flight, steps without placeholders (`_schedule`), so that each
        stage has work; static pipelines run a replica per stage, one step each; one-stage
        plans keep two in flight under async scheduling."""
        if replica.num_structured:
            return 1
        stages = self._stages(replica)
        if stages > 1:
            alone = replica.group is not None and sum(
                r.group == replica.group for r in self.replicas) == 1
            return stages if alone else 1
        return self.steps_in_flight

    def _stages(self, replica: "Replica") -> int:
        """The pipeline stages of the replica's plan (its group's plan, or the plan it was
        left behind in; a change of plan drains its steps first)."""
        name = replica.left_plan if replica.is_left_behind else None
        plan = self._plans_by_name[name] if name else self.layout.plans[replica.group]
        return plan.pp

    def _step_batch(self, replica: "Replica", sched: SchedulerOutput, plan: str):
        batch = replica.step_batch(sched, plan)
        if batch.finished_request_ids and len(self.replicas) > 1:
            batch.finished_request_ids = self._forgets_to_send(replica, batch)
        if self.seesaw and not replica.is_left_behind:
            self._add_stashes(replica, sched, batch)
        if replica.num_structured:
            batch.token_masks = self.structured.masks(
                [s.seq.request_id if s.samples else None for s in sched.scheduled])
        return batch

    def _forgets_to_send(self, replica: "Replica", batch) -> list[str]:
        """The ids its ranks may forget now. A replica sends its queue of forgets only with
        its next step, and a move queues one on every group it makes (a group left behind
        can step long after): a forget of a request that a replica on some of the same
        ranks has sent since waits in the queue until the request ends."""
        ranks, send, wait = set(replica.ranks), [], []
        for request_id in batch.finished_request_ids:
            holder = self._replica_of.get(request_id)
            stale = (holder is not None and request_id in holder.encoder.sent_blocks
                     and not ranks.isdisjoint(holder.ranks)
                     and not (holder is replica and request_id in batch.new_params))
            (wait if stale else send).append(request_id)
        replica.encoder.finished += wait
        return send

    def _add_stashes(self, replica: "Replica", sched: SchedulerOutput, batch) -> None:
        """A seesaw group's step in the prefill phase also writes the KV of the prompts its
        earlier steps finished to the tier (its swaps out: seesaw takes no swap preemption)."""
        tier = self.seesaw[tuple(sorted(replica.ranks))]
        if not tier.gate.prefill:
            return
        ready = tier.stashes(replica.scheduler.running,
                             {s.seq.request_id for s in sched.scheduled})
        if ready:
            batch.swap_out = [KVSwap(seq.request_id, list(move.block_table), move.num_tokens,
                                     move.slot_start, move.slot_length) for seq, move in ready]
            batch.swap_tier_path, batch.swap_tier_tokens = tier.handle.path, tier.handle.tokens

    def _commit_drained_transitions(self) -> None:
        """Commits each pending transition whose groups' ranks have no step in flight (of
        any replica): its ranks prepare, then commit at this step boundary."""
        busy = {rank for r in self.replicas if r.in_flight for rank in r.ranks}
        in_flight = {g for g, plan in enumerate(self.layout.plans) if busy.intersection(plan.ranks)}
        for pending in self.transitions.take_drained(in_flight):
            self._commit(pending)
        if self._unplaced:
            self._place_unplaced()

    def _commit(self, pending) -> None:
        transition = pending.transition
        drain_s = time.monotonic() - pending.requested_at
        layout = check(transition, self.layout, self._plans_by_name, bool(self.seesaw))
        ranks = sorted(r for g in transition.groups for r in self.layout.plans[g].ranks)
        names = [layout.plans[layout.group_of_rank(r)].name() for r in ranks]
        self._epoch += 1
        moving = [] if changes_partition(transition) else [  # seesaw re-shards keep the groups
            (g, self.seesaw[tuple(sorted(layout.plans[g].ranks))]) for g in transition.groups
            if layout.plans[g] != self.layout.plans[g]
            and tuple(sorted(layout.plans[g].ranks)) in self.seesaw]
        began = time.perf_counter()
        # the KV leaves the old plan's pools for the tier, and enters the new plan's
        outs = [s for g, tier in moving for s in self._seesaw_move(g, tier, "out", layout.plans[g])]
        stashed = sum(tier.take_stashed_bytes() for _, tier in moving)
        prepare_s = self.executor.transition(ranks, "prepare", names, self._epoch)
        start = time.perf_counter()
        ins = [s for g, tier in moving for s in self._seesaw_move(g, tier, "in", layout.plans[g])]
        self.executor.transition(ranks, "commit", names, self._epoch)
        if changes_partition(transition):
            moved, reprefilled, kept = self._regroup(transition.groups, layout,
                                                     self._preemption(transition))
        else:  # each group keeps its ranks: its replicas, with their block tables, run the new plan
            moved = sum(r.load for r in self.replicas if r.group in transition.groups)
            reprefilled = kept = 0
        self.layout = layout
        stall_s = time.perf_counter() - began
        record = TransitionRecord(time.time(), transition.kind, transition.groups,
                                  transition.target, drain_s, prepare_s,
                                  time.perf_counter() - start, moved, reprefilled, kept, stall_s,
                                  **seesaw_stats(moving, outs, ins, stashed))
        for _, tier in moving:
            tier.seconds["transition"] += stall_s
        if moving:
            logger.info("seesaw %s of group(s) %s: drain %.3f s, weights %.1f MiB (%.1f from "
                        "peers, %.1f from host) in %.3f s, KV %.1f MiB out / %.1f MiB in, stall "
                        "%.3f s", record.direction, list(transition.groups), drain_s,
                        record.weight_bytes / 2**20, record.weight_peer_bytes / 2**20,
                        record.weight_host_bytes / 2**20, record.weight_s,
                        record.kv_bytes_out / 2**20, record.kv_bytes_in / 2**20, stall_s)
        else:
            logger.info("%s of group(s) %s to %s: %d request(s) moved (%d computed again), %d "
                        "kept, stall %.3f s", transition.kind, list(transition.groups),
                        ",".join(record.target), moved, reprefilled, kept, stall_s)
        self._transition_records.append(record)
        if self._timeline is not None:
            self._timeline.write(json.dumps({"transition": asdict(record)}) + "\n")

    def _seesaw_move(self, group: int, tier: SeesawTier, verb: str, target: Plan) -> list[dict]:
        """One phase of a seesaw group's KV and weight moves to `target` on its ranks."""
        seqs = [seq for r in self.replicas if r.group == group for seq in r.scheduler.running]
        moves = tier.moves(tier.to_move_out(seqs) if verb == "out" else seqs)
        if verb == "in":
            tier.enter(target)
        state = "stashed" if verb == "out" else "writing" if tier.gate.prefill else "loading"
        for seq in seqs:
            if seq.request_id in tier.slots.slots:
                tier.slots.mark(seq.request_id, state)
        ranks = list(target.ranks)
        return self.executor.seesaw_move(ranks, verb, [target.name()] * len(ranks), moves,
                                         tier.handle)

    def _preemption(self, transition) -> str:
        """How a merge or split treats its running requests: `--flying-preemption`, or
        under auto the transition's own (soft when it names none)."""
        if self.config.flying_preemption != "auto":
            return self.config.flying_preemption
        return transition.preemption or "soft"

    def _regroup(self, groups: tuple[int, ...], layout, preemption: str) -> tuple[int, int, int]:
        """The merged or split groups' replicas leave the layout. Their waiting requests
        move to the groups that replace them; their running ones stay where their KV was
        written and finish there in their old plan (the KV adaptor), interleaved with the
        new groups' steps (soft preemption) or paused while those have more urgent ones (hard);
        under `recompute` they move too and are computed again. A new group whose plan
        and ranks are those of replicas left behind takes them back. Returns (requests
        moved, requests computed again, requests kept in their old plan)."""
        leaving = [r for r in self.replicas if r.group in groups]
        recompute = preemption == "recompute"
        reprefilled = sum(r.scheduler.num_running for r in leaving) if recompute else 0
        seqs = []
        for replica in leaving:
            evicted = (replica.scheduler.evict_all() if recompute
                       else replica.scheduler.evict_waiting())
            for seq in evicted:
                replica.encoder.drop(seq.request_id)
                replica.num_structured -= seq.params.structured_outputs is not None
            seqs += evicted
            replica.leave(self.layout.plans[replica.group].name(), preemption == "hard")
        seqs.sort(key=Sequence.sort_key)
        arrivals = sorted(t for r in leaving for t in r.arrivals)
        for replica in self.replicas:
            if not replica.is_left_behind:
                replica.group = layout.group_of_rank(replica.ranks[0])
        self.layout = layout
        new = [self._replica_for_group(g) for g in range(len(layout.plans))
               if not any(r.group == g for r in self.replicas)]
        self.replicas = sorted(self.replicas, key=lambda r: (r.is_left_behind, r.group or 0))
        self._drop_finished_left_behind()
        for k, replica in enumerate(new):
            replica.arrivals.extend(arrivals[k::len(new)])
            # what the ranks hold of the moved requests goes with the new groups' first step
            # (before any of them is sent there again)
            replica.encoder.finished += [seq.request_id for seq in seqs]
        for seq in seqs:
            target = min(new, key=lambda r: r.load)
            target.scheduler.add(seq)
            target.num_structured += seq.params.structured_outputs is not None
            self._replica_of[seq.request_id] = target
        kept = sum(r.scheduler.num_running for r in leaving if r.is_left_behind)
        return len(seqs), reprefilled, kept

    def _replica_for_group(self, group: int) -> Replica:
        """The replica of a new group: the one left behind in its plan on its ranks (its
        requests resume without recompute), or a new one over its ranks' blocks."""
        plan = self.layout.plans[group]
        for replica in self.replicas:
            if replica.is_left_behind and replica.left_plan == plan.name():
                replica.rejoin(group)
                return replica
        size = min(self.executor.rank_blocks[r] for r in plan.ranks)
        replica = self._make_replica(group, size, 0)
        self.replicas.append(replica)
        return replica

    def _drop_finished_left_behind(self) -> None:
        """Replicas left behind whose requests have all ended give their blocks back to the
        pool; the requests they finished are dropped on their ranks with the next step of
        the groups there."""
        for replica in [r for r in self.replicas if r.is_left_behind
                        and not r.scheduler.has_unfinished() and not r.in_flight]:
            replica.block_manager.unshare()
            self.replicas.remove(replica)
            finished = replica.encoder.take_finished()
            for other in self.replicas:
                if not other.is_left_behind and other.block_manager.overlaps(replica.block_manager):
                    other.encoder.finished += finished

    def take_transition_records(self) -> list[TransitionRecord]:
        """Transitions committed since the last call (the most recent 10,000 at most)."""
        records = list(self._transition_records)
        self._transition_records.clear()
        return records

    def view(self) -> NodeView:
        """The node as policies see it, one view per group of the layout (a group with
        pipeline parallelism serves several replicas: their counters are added up)."""
        now = time.monotonic()
        views: list[list[GroupView]] = [[] for _ in self.layout.plans]
        requests = getattr(self.policy, "reads_requests", False)
        for replica in self.serving_replicas():
            view = replica.view(now)
            if replica.scheduler.gate is not None:
                view = self._tier_counters(replica, view)
            views[replica.group].append(self._request_counters(replica, view) if requests else view)
        groups = [combine_views(v) for v in views]
        for replica in self.replicas:
            if replica.is_left_behind and replica.scheduler.num_running:
                self._count_left_behind(replica, groups)
        return NodeView(tuple(groups), now,
                        tuple(plan.name() for plan in self.layout.plans),
                        tuple(self.max_context.items()),
                        max(map(self._need, self._unplaced.values()), default=0),
                        tuple((plan, statistics.median(steps))
                              for plan, steps in sorted(self._decode_s.items())))

    def _count_left_behind(self, replica: Replica, groups: list[GroupView]) -> None:
        """A replica left behind still runs its requests on its ranks: they count as the
        running load of the group on its first rank (else a split that leaves them behind
        shows the policy an idle node, which merges and splits again without end). Its ranks
        are in the layout: a lost rank's replicas lose their requests (`_evict_lost`)."""
        group = self.layout.group_of_rank(replica.ranks[0])
        running = groups[group].num_running + replica.scheduler.num_running
        groups[group] = dataclasses.replace(groups[group], num_running=running)

    def _request_counters(self, replica: Replica, view: GroupView) -> GroupView:
        """The view with what the flying policy reads of its requests (a pass over them, for
        policies with `reads_requests` only). `recompute_tokens`: what its running requests
        would compute again if a merge or split moved them."""
        running, plan = replica.scheduler.running, self.layout.plans[replica.group].name()
        needs = [self._need(seq) for seq in [*running, *replica.scheduler.waiting]]
        return dataclasses.replace(
            view, kv_capacity=replica.scheduler.config.max_model_len,
            longest_need=max(needs, default=0),
            longest_decode_left=max((self._need(s) - s.num_tokens for s in running), default=0),
            recompute_tokens=sum(s.num_computed_tokens for s in running),
            step_s=self._last_step_s.get(plan, 0.0),
            prefill_tokens_per_s=self._prefill_rate.get(plan, 0.0))

    def _tier_counters(self, replica: Replica, view: GroupView) -> GroupView:
        """The view with its seesaw group's tier: its fill, the room for its next prompt and
        the tokens that prompt's slot takes; and the prompt tokens its running requests
        still compute (read in the prefill phase only)."""
        tier = self.seesaw[tuple(sorted(replica.ranks))]
        waiting = replica.scheduler.waiting
        first = waiting[0] if waiting else None
        left = sum(max(0, s.num_prompt_tokens - s.num_computed_tokens)
                   for s in replica.scheduler.running) if tier.gate.prefill else 0
        return dataclasses.replace(
            view, cpu_tier_fill=tier.slots.fill, cpu_tier_free_run=tier.free_run(first),
            next_prompt_tokens=self._need(first) if first is not None else 0,
            prompt_tokens_left=left)

    def set_policy(self, policy: Policy) -> None:
        """Replaces the policy (benchmarks, tests); it may pick only plans made at start-up."""
        made = {p.name() for p in self.policy_plans}
        unknown = [p.name() for p in policy.plans if p.name() not in made]
        if unknown:
            raise ValueError(f"plans {unknown} were not made at start-up (made: {sorted(made)})")
        self.policy = policy

    def _record_step(self, replica: int, plan: str, sched: SchedulerOutput,
                     seconds: float) -> None:
        num_tokens = sched.num_batched_tokens
        record = StepRecord(time.time(), replica, plan, num_tokens, seconds)
        if num_tokens - sched.num_chunks >= PREFILL_RATE_MIN_TOKENS and seconds > 0:
            ranks = len(self._plans_by_name[plan].ranks) if plan in self._plans_by_name else 1
            self._prefill_rate[plan] = num_tokens / seconds / ranks
        tier = self.seesaw.get(tuple(sorted(self.replicas[replica].ranks))) if self.seesaw else None
        if tier is not None:
            tier.seconds["prefill" if plan == tier.prefill.name() else "decode"] += seconds
        decode = num_tokens == sched.num_chunks
        if decode:
            self._decode_s.setdefault(plan, deque(maxlen=DECODE_STEPS_KEPT)).append(seconds)
        if decode or plan not in self._decode_s:
            self._last_step_s[plan] = seconds
        self._step_records.append(record)
        if self._timeline is not None:
            self._timeline.write(json.dumps(asdict(record)) + "\n")

    def take_phase_seconds(self) -> dict[str, float]:
        """Seesaw groups' seconds in prefill steps, decode steps, transitions and idle (the
        rest of the wall time), summed over the groups, since the last call (or start-up)."""
        totals = dict.fromkeys(PHASES, 0.0)
        for tier in self.seesaw.values():
            for phase, seconds in tier.take_seconds().items():
                totals[phase] += seconds
        return totals

    def take_step_records(self) -> list[StepRecord]:
        """Steps finished since the last call (the most recent 10,000 at most)."""
        records = list(self._step_records)
        self._step_records.clear()
        return records

    def _apply(self, replica: "Replica", sched: SchedulerOutput, tokens: list[int],
               logprobs, errors: dict[str, str]) -> None:
        """A step's results: its tokens go to the scheduler and, with the requests they
        ended, to the output processor. A request the ranks failed fails alone."""
        tokens = self._token_ints.canonical(tokens)
        for scheduled in sched.scheduled if errors else ():
            seq = scheduled.seq
            if seq.request_id in errors and seq.request_id in self._replica_of:
                self._fail(replica, seq, errors[seq.request_id])
        sampling = [s.seq for s in sched.chunks if s.samples]
        if sched.decodes:
            sampling = sched.decodes.seqs + sampling
        step = _step_tokens(sampling, tokens, logprobs)  # before the scheduler ends any
        finished = replica.scheduler.update(sched, tokens)
        if self.config.check_step_state:
            replica.scheduler.check_table()
        if replica.num_structured:
            sampled = {seq.request_id: tok for seq, tok in zip(sampling, tokens)}
            finished += self._advance_grammars(replica, sampling, sampled)
        for seq in finished:
            step.finished[seq.request_id] = (seq.finish_reason, seq.stop_reason)
            self._release(replica, seq.request_id)
        if self._parent_of:
            self._admit_waiting_siblings(sampling)
        self.output_processor.submit(step)
        self._collect()

    def _admit_waiting_siblings(self, sampling: list[Sequence]) -> None:
        """A first child that has its first token has computed the prompt: its siblings
        join (unless it failed)."""
        for seq in sampling:
            parent = self._parent_of.get(seq.request_id)
            if (parent is not None and not parent.siblings_admitted
                    and parent.request_id in self._parents and seq.finish_reason != "error"
                    and seq.num_output_tokens):
                self._admit_siblings(parent, seq.prompt_token_ids, seq.prompt)

    def _advance_grammars(self, replica: "Replica", sampling: list[Sequence],
                          sampled: dict[str, int]) -> list[Sequence]:
        """Feeds each constrained request its new token; one whose grammar refused it
        fails, one whose grammar has ended is finished (also under ignore_eos). Returns
        the latter."""
        ended = []
        for seq in sampling:
            request_id = seq.request_id
            if not self.structured.tracks(request_id):
                continue
            if not self.structured.accept(request_id, sampled[request_id]):
                # a refused token leaves the matcher where it was: was any token allowed?
                self._fail(replica, seq, NO_CONTINUATION if not self.structured.can_continue(
                    request_id) else f"the sampled token {sampled[request_id]} does not "
                    "follow its structured output")
            elif self.structured.is_terminated(request_id) and not seq.is_finished:
                replica.scheduler.finish(seq, "stop")
                ended.append(seq)
        return ended

    def _fail(self, replica: "Replica", seq: Sequence, reason: str) -> None:
        """Ends one request with finish reason "error"; its blocks are freed."""
        replica.scheduler.finish(seq, "error")
        if self.structured.tracks(seq.request_id):
            replica.num_structured -= 1
        replica.encoder.forget(seq.request_id)
        self._report_failure(seq, reason)

    def _release(self, replica: "Replica", request_id: str) -> None:
        if self.structured.tracks(request_id):
            self.structured.remove(request_id)
            replica.num_structured -= 1
        self._replica_of.pop(request_id, None)
        replica.encoder.forget(request_id)

    def stats(self) -> EngineStats:
        serving = self.serving_replicas()  # (replicas left behind share their blocks)
        counts = self._preemptions
        return EngineStats(sum(r.scheduler.num_running for r in self.replicas),
                           sum(r.scheduler.num_waiting for r in self.replicas) + len(self._unplaced),
                           sum(r.block_manager.num_free_blocks for r in serving),
                           sum(r.block_manager.num_blocks for r in serving),
                           counts.preemptions, counts.swapped_out, counts.swapped_in,
                           counts.swap_bytes_out, counts.swap_bytes_in,
                           sum(s.slots.used_tokens for s in self.swap_spaces.values()),
                           counts.recompute_tokens)


def _step_tokens(sampling: list[Sequence], tokens: list[int], logprobs) -> StepTokens:
    """The tokens of the requests that take them (not those ended while the step ran)."""
    done = SequenceStatus.FINISHED
    request_ids = [seq.request_id for seq in sampling if seq.status is not done]
    if len(request_ids) == len(sampling) == len(tokens):
        return StepTokens(request_ids, tokens, logprobs, {})
    kept = [i for i, seq in enumerate(sampling) if seq.status is not done]
    return StepTokens(request_ids, [tokens[i] for i in kept],
                      None if logprobs is None else [logprobs[i] for i in kept], {})


def decode_round_rows(scheds: list[SchedulerOutput]) -> int:
    """A CaS round's rows per replica where every replica decodes (a token per sequence,
    no swaps): the most sequences of one; else 0."""
    if any(sched.swap_out or sched.swap_in or sched.num_batched_tokens != sched.num_chunks
           for sched in scheds):
        return 0
    return max(sched.num_chunks for sched in scheds)


def _async_scheduling(config: EngineConfig, plans: list[Plan]) -> bool:
    """On by default for the plans of one stage: their next step carries placeholders for
    the tokens on their way. A pipeline's first stage never sees those tokens, so its steps
    overlap only without placeholders (`_steps_in_flight`); asked for where every plan is
    pipelined, an error."""
    if config.async_scheduling is None:
        return any(plan.pp == 1 for plan in plans)
    if config.async_scheduling and all(plan.pp > 1 for plan in plans):
        raise ValueError(f"async_scheduling does not work with pipeline parallelism "
                         f"(plan {plans[0].name()})")
    return config.async_scheduling


# A step's prompt tokens (beyond one token per sequence) from which its time measures the
# plan's prefill rate for the switch costs: shorter steps are mostly fixed cost.
PREFILL_RATE_MIN_TOKENS = 256
# A plan's decode step time is the median of its last this many (a step collected together
# with the one before it is timed from that one's end: near zero)
DECODE_STEPS_KEPT = 16
