"""The engine loop: requests in, one scheduled step at a time, outputs out. Where the
requests go, which replicas step under which plan, and every change of the layout are the
node's (node.py); the ranks are the executor's (parashift/executor)."""
import json
import logging
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass

from parashift.config import EngineConfig
from parashift.executor import make_executor
from parashift.gc_tuning import restore_garbage_collector, tune_garbage_collector
from parashift.engine.node import Node
from parashift.engine.output_processor import make_output_processor
from parashift.engine.parallel_sampling import ParentRequest, fold_children
from parashift.engine.policy import NodeView, Policy
from parashift.engine.prompt_logprobs import PromptLogprobsCollector
from parashift.engine.replica import Replica
from parashift.engine.request_outputs import (Failure, Forget, NewRequest, Processed,
                                             StepTokens)
from parashift.engine.routing import check_fits, need
from parashift.engine.scheduler import Scheduler, SchedulerOutput
from parashift.engine.seesaw_auto import resolve_auto_plans
from parashift.engine.static_fallback import resolve_static_fallback
from parashift.engine.seesaw import PHASES
from parashift.engine.sequence import Sequence, SequenceStatus
from parashift.engine.spec_steps import VerifiedStep
from parashift.engine.startup import (eos_token_ids, make_tokenizer, request_defaults,
                                      resolve_device, resolve_dtype, resolve_max_model_len,
                                      with_step_budget)
from parashift.engine.swap import PreemptionCounts
from parashift.engine.token_ints import TokenInts
from parashift.engine.transitions import TransitionRecord
from parashift.kv.block_manager import BlockManager
from parashift.loader.source import load_hf_config, resolve_model
from parashift.quantization.scheme import weight_quant
from parashift.outputs import RequestOutput
from parashift.sampling_params import SamplingParams, check_max_logprobs
from parashift.spec_decode import make_speculator
from parashift.structured.matchers import NO_CONTINUATION, StructuredOutputs

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
    # speculative decoding (vLLM's names): verifications of a sequence's draft, draft
    # tokens, the accepted ones
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0


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
        self.config = config = with_step_budget(config, self.device, offline, self.max_model_len)
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        self.config = config = resolve_auto_plans(config, hf_config, self.dtype, self.device)
        self.config = config = resolve_static_fallback(config, hf_config)
        self._hf_config = hf_config
        weight_quant(config.quantization, hf_config)  # a scheme not supported fails here
        self.node = Node(config, hf_config, self.dtype, self.max_model_len)
        self._transition_records: deque[TransitionRecord] = deque(maxlen=10_000)
        self._timeline = open(config.timeline_file, "a") if config.timeline_file else None
        self._step_records: deque[StepRecord] = deque(maxlen=10_000)
        self.executor = make_executor(config, hf_config, source, self.node.layout,
                                      self.node.policy_plans, self.device, self.dtype,
                                      self.max_model_len)
        self._finalizer = weakref.finalize(self, self.executor.shutdown)  # no orphan workers
        self._eos_ids = eos_token_ids(hf_config, self.tokenizer, source)
        self.structured = StructuredOutputs(self.tokenizer, self.vocab_size, self._eos_ids)
        self._token_ints = TokenInts(self.vocab_size)  # (before the collector freezes start-up)
        self.node.start(self.executor, self._eos_ids)
        self.output_processor = output_processor or make_output_processor(
            self.tokenizer, config.output_processor, self.device.type)
        self._processor_finalizer = weakref.finalize(self, self.output_processor.close)
        self._owed: set[str] = set()  # requests handed to the processor, final output not taken
        self._aborted: set[str] = set()  # aborted requests the processor has yet to forget
        self._ready: list[RequestOutput] = []  # outputs taken from the processor, not returned
        self._parents: dict[str, ParentRequest] = {}  # requests with n or best_of > 1
        self._parent_of: dict[str, ParentRequest] = {}  # by child request id
        self._preemptions = PreemptionCounts()
        self._prompt_logprobs = PromptLogprobsCollector()
        # speculative decoding's proposer and counts (None: off)
        self.speculator = make_speculator(config.speculative_config, self)
        tune_garbage_collector()
        logger.info("Loaded %s in %.1f s", self.model_name, time.perf_counter() - started)

    # ---- the node, as callers read it (node.py) ----------------------------------------
    @property
    def layout(self):
        return self.node.layout

    @property
    def policy(self) -> Policy:
        return self.node.policy

    @property
    def policy_plans(self) -> list:
        return self.node.policy_plans

    @property
    def replicas(self) -> list[Replica]:
        return self.node.replicas

    @property
    def seesaw(self) -> dict:
        """Each seesaw group's CPU KV tier, by its ranks (empty without the seesaw policy)."""
        return self.node.seesaw

    @property
    def faults(self):
        return self.node.faults

    def placement(self) -> dict[str, tuple[int, ...]]:
        """The ranks of each placed request's replica (benchmarks: which group serves it)."""
        return {request_id: replica.ranks for request_id, replica in self.node.replica_of.items()}

    def worker_pids(self) -> list[int | None]:
        """Each rank's worker process id (None: not a process of this host; benchmarks)."""
        return [getattr(proc, "pid", None) for proc in getattr(self.executor, "procs", [])]

    @property
    def transitions(self):
        return self.node.transitions

    @property
    def max_context(self) -> dict[int, int]:
        return self.node.max_context

    @property
    def steps_in_flight(self) -> int:
        return self.node.steps_in_flight

    def view(self) -> NodeView:
        return self.node.view()

    def set_policy(self, policy: Policy) -> None:
        """Replaces the policy (benchmarks, tests); it may pick only plans made at start-up."""
        self.node.set_policy(policy)

    def set_layout(self, width: int | None) -> None:
        """Forces every aligned group of `width` replicas to merge (the groups merge or
        split to it, one at a time, while the others serve); None hands the layout back to
        the policy. Refuses a width this node cannot take, or one too narrow for a request
        it holds."""
        self.node.set_layout(width)

    def layout_info(self) -> dict:
        """The current layout: its groups, whether a width is forced, and the longest
        context of each width the node can take."""
        return self.node.layout_info()

    def kv_tokens_by_width(self) -> dict[int, int]:
        """The KV tokens one group of each width's layout holds at most."""
        return self.node.kv_tokens_by_width()

    @property
    def scheduler(self) -> Scheduler:
        """The first replica's scheduler (the only one without data parallelism)."""
        return self.node.replicas[0].scheduler

    @property
    def runner(self):
        """The in-process model runner (single device only)."""
        runner = self.executor.local_runner
        if runner is None:
            raise AttributeError("the model runs in worker processes under this plan")
        return runner

    @property
    def block_manager(self) -> BlockManager:
        return self.node.replicas[0].block_manager

    def shutdown(self) -> None:
        if self._finalizer.alive:
            restore_garbage_collector()
        self._finalizer()
        self._processor_finalizer()
        self.node.close()
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
        check_max_logprobs(params, self.config.max_logprobs)
        prompt_text, token_ids = self._tokenize(prompt)
        self._validate_prompt(token_ids)
        check_fits(need(len(token_ids), params.max_tokens, self.max_model_len), len(token_ids),
                   self.max_context, self.node.forced_width())
        self.node.check_tier_fits(need(len(token_ids), params.max_tokens, self.max_model_len))
        parent = ParentRequest(request_id, params, priority) if params.num_samples > 1 else None
        for used in [request_id, *(parent.child_ids if parent else ())]:
            if self.node.holds(used) or used in self._parents or used in self._owed:
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

    def _add_sequence(self, seq: Sequence, replica: Replica | None = None) -> Replica | None:
        """Queues a sequence on `replica`, by default the one routing picks; one that no
        group holds waits, unplaced, for the policy to merge one (routing.py)."""
        if replica is None or replica.is_left_behind:
            replica = self.node.route(seq)
        if replica is None:
            self.node.hold(seq)
            return None
        request_id, params = seq.request_id, seq.params
        if params.structured_outputs is not None:
            self.structured.add(request_id, params.structured_outputs)
            replica.num_structured += 1
        self.node.admit(seq, replica, time.monotonic())
        if params.prompt_logprobs is not None:
            self._prompt_logprobs.expect(request_id)
        # a child of a request with n > 1 reports every step: its parent folds the outputs
        every_step = params.output_kind != "final_only" or request_id in self._parent_of
        self.output_processor.submit(NewRequest(seq, every_step))
        self._owed.add(request_id)
        return replica

    def _place_unplaced(self) -> None:
        """Queues the unplaced requests that a group of the layout now holds; asks the
        policy again for the others."""
        for seq, replica in self.node.take_placeable():
            self._add_sequence(seq, replica)
        if self.node.unplaced:
            self.node.decide_now()

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
        # the common case (plain ints) checked in C: a long prompt's check is on its TTFT
        if not set(map(type, prompt)) <= {int} and not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("a token-id prompt must be a list of integers")
        return None, list(prompt)

    def _validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"token id {bad} is out of vocabulary (size {self.vocab_size})")
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
        if self.node.unplaced.pop(request_id, None) is not None:
            return
        replica = self.node.replica_of.get(request_id)
        if replica is not None and replica.scheduler.abort(request_id) is not None:
            self._release(replica, request_id)

    def check_health(self) -> None:
        """Takes the groups of ranks that died or stopped answering out of service (cheap,
        for idle loops); raises WorkerFailure once no group is left to serve."""
        self.executor.check_health()
        self._take_losses()

    def _take_losses(self) -> None:
        """Takes the groups of the ranks the executor lost out of service (the node); fails
        the requests no group left holds. Raises once the engine has failed."""
        for seq, reason in self.node.take_losses():
            self._report_failure(seq, reason)

    def _report_failure(self, seq: Sequence, reason: str) -> None:
        """Ends a request with finish reason "error"; its last output comes from the output
        processor (with the text it has)."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, "error"
        self.node.replica_of.pop(seq.request_id, None)
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
        return bool(self.node.unplaced) or any(r.scheduler.has_unfinished() for r in self.replicas)

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
                self._record_step(replica, plan, sched, seconds)
                self._apply(replica, sched, *result)
            # once no request is left to compute, no step stays in flight (e.g. one of a
            # replica that had nothing to run, in a round of replicas that step together)
            if self._has_work() or not any(r.in_flight for r in self.replicas):
                break
        self._take_losses()
        self.node.drop_finished_left_behind()
        self._commit_drained_transitions()
        return self._take_outputs()

    def idle_turn(self) -> bool:
        """With nothing to run, a policy that acts when idle may change the layout now, so
        that the next request does not wait for the change in its time to first token (the
        flying policy merges an idle node before the queue builds; a forced width applies
        at once). True if the layout changed."""
        if (not getattr(self.node.policy, "acts_when_idle", False)
                or self.has_unfinished_requests() or any(r.in_flight for r in self.replicas)):
            return False
        before = self.node.layout
        for _ in range(len(before.plans)):  # one merge or split a decision
            if not self.node.decide_now():
                break
            self._commit_drained_transitions()
        return self.node.layout is not before

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
        if self.node.unplaced.pop(request_id, None) is not None:
            return
        replica = self.node.replica_of.get(request_id)
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
        replica = self.node.replica_of.get(parent.child_ids[0])
        for index in range(1, len(parent.child_ids)):
            self._add_sequence(parent.child(index, token_ids, prompt_text), replica)

    def _submit_round(self) -> bool:
        """Asks the policy for every group's next plan (before scheduling), then schedules
        and submits one step on each replica with room; False once none was submitted.
        Drafts (speculative decoding) come first, on the replicas with room for a step:
        the policy sees their tokens."""
        if self.speculator is not None:
            node = self.node
            for replica in self.replicas:
                if len(replica.in_flight) < node.steps_in_flight_of(replica):
                    self.speculator.propose(replica.scheduler, self._allowed_draft,
                                            node.schedules_ahead(replica))
        round_ = self.node.next_round()
        if round_ is None:
            return False
        submitted = False
        for replicas in round_.together:
            submitted |= self._submit_together(replicas, round_.decision)
        for replica in round_.alone:
            sched = self._schedule(replica)
            if sched.is_empty:
                if replica.scheduler.gate is not None and not replica.in_flight:
                    # its phase is stuck: the policy switches
                    replica.scheduler.gate.stalled = replica.scheduler.num_waiting > 0
                continue
            plan = self.node.plan_for(replica, round_.decision)
            self.executor.submit(replica, plan.ranks, plan.output_rank(),
                                 self._step_batch(replica, sched, plan.name()))
            replica.start(sched, plan.name())
            submitted = True
        return submitted

    def _submit_together(self, replicas: list[Replica], decision) -> bool:
        """One step on each of coupled groups' replicas, all in one round (Compute-as-a-
        Service), a replica with nothing to run included; none if none has a step."""
        scheds = [self._schedule(r) for r in replicas]
        if all(sched.is_empty for sched in scheds):
            return False
        round_id = self.node.new_round_id()
        rows = decode_round_rows(scheds)
        tokens = {} if rows else {rank: sched.num_batched_tokens
                                  for replica, sched in zip(replicas, scheds)
                                  for rank in replica.ranks}
        for replica, sched in zip(replicas, scheds):
            plan = self.node.plan_for(replica, decision)
            batch = self._step_batch(replica, sched, plan.name())
            batch.round_id, batch.round_rows, batch.round_tokens = round_id, rows, tokens
            self.executor.submit(replica, plan.ranks, plan.output_rank(), batch)
            replica.start(sched, plan.name())
        return True

    def _schedule(self, replica: Replica) -> SchedulerOutput:
        """The replica's next step. A pipeline's first stage never sees the sampled tokens
        that fill a step's placeholders: in a plan of several stages a sequence whose token
        is on its way waits for it (its scheduler defers it)."""
        replica.scheduler.defer_pending = self.node.stages(replica) > 1
        sched = replica.scheduler.schedule()
        if self.config.check_step_state:
            replica.scheduler.check_table()
        self._preemptions.add(sched, self.node.tier_shape.token_bytes)
        return sched

    def _allowed_draft(self, seq: Sequence, draft: list[int]) -> list[int]:
        """A structured request's draft up to the first token its grammar refuses."""
        if self.structured.tracks(seq.request_id):
            return self.structured.allowed_draft(seq.request_id, draft)
        return draft

    def _step_batch(self, replica: Replica, sched: SchedulerOutput, plan: str):
        batch = replica.step_batch(sched, plan)
        if batch.finished_request_ids and len(self.node.replicas) > 1:
            batch.finished_request_ids = self.node.forgets_to_send(
                replica, batch.finished_request_ids, batch.new_params)
        if self.node.seesaw and not replica.is_left_behind:
            self.node.add_stashes(replica, sched, batch)
        if replica.num_structured:
            scheduled = sched.scheduled
            batch.token_masks = self.structured.masks(
                [s.seq.request_id if s.samples else None for s in scheduled],
                [s.draft for s in scheduled] if self.speculator is not None else None)
        return batch

    def _commit_drained_transitions(self) -> None:
        """Commits the pending transitions whose groups have drained (the node), then
        queues the requests a new group holds."""
        for record in self.node.commit_drained():
            self._transition_records.append(record)
            if self._timeline is not None:
                self._timeline.write(json.dumps({"transition": asdict(record)}) + "\n")
        if self.node.unplaced:
            self._place_unplaced()

    def take_transition_records(self) -> list[TransitionRecord]:
        """Transitions committed since the last call (the most recent 10,000 at most)."""
        records = list(self._transition_records)
        self._transition_records.clear()
        return records

    def _record_step(self, replica: Replica, plan: str, sched: SchedulerOutput,
                     seconds: float) -> None:
        num_tokens = sched.num_batched_tokens
        record = StepRecord(time.time(), self.replicas.index(replica), plan, num_tokens, seconds)
        self.node.note_step(replica, plan, num_tokens, sched.num_chunks, seconds)
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
               logprobs, errors: dict[str, str], prompt_spans: list | None = None) -> None:
        """A step's results: its tokens go to the scheduler and, with the requests they
        ended (and the prompt logprobs of those whose prompt is computed), to the output
        processor. A request the ranks failed fails alone."""
        if prompt_spans:
            self._prompt_logprobs.add(prompt_spans)
        tokens = self._token_ints.canonical(tokens)
        for scheduled in sched.scheduled if errors else ():
            seq = scheduled.seq
            if seq.request_id in errors and seq.request_id in self.node.replica_of:
                self._fail(replica, seq, errors[seq.request_id])
        sampling = [s.seq for s in sched.chunks if s.samples]
        if sched.decodes:
            sampling = sched.decodes.seqs + sampling
        if self.speculator is not None and len(tokens) > len(sampling):  # verifications
            tokens, logprobs = self.speculator.verify(sched, tokens, logprobs)
            step = VerifiedStep(sampling)  # before the scheduler ends any
        else:
            step = _step_tokens(sampling, tokens, logprobs)
        if self._prompt_logprobs.expected:
            step.prompt_logprobs = self._prompt_logprobs.take_computed(sampling)
        finished = replica.scheduler.update(sched, tokens)
        if self.config.check_step_state:
            replica.scheduler.check_table()
        if replica.num_structured:
            sampled = {seq.request_id: tok for seq, tok in zip(sampling, tokens)}
            finished += self._advance_grammars(replica, sampling, sampled)
        for seq in finished:
            step.finished[seq.request_id] = (seq.finish_reason, seq.stop_reason)
            if self.speculator is not None:
                self.speculator.finish(seq.request_id, seq.output_token_ids)
            self._release(replica, seq.request_id)
        if self._parent_of:
            self._admit_waiting_siblings(sampling)
        for message in step.messages(logprobs) if not isinstance(step, StepTokens) else (step,):
            self.output_processor.submit(message)
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
                          sampled: dict[str, int | list[int]]) -> list[Sequence]:
        """Feeds each constrained request its new token (a verification's accepted ones in
        order); one whose grammar refused one fails, one whose grammar has ended is
        finished (also under ignore_eos). Returns the latter."""
        ended = []
        for seq in sampling:
            request_id = seq.request_id
            if not self.structured.tracks(request_id):
                continue
            tokens = sampled[request_id]
            for token in tokens if isinstance(tokens, list) else (tokens,):
                if not self.structured.accept(request_id, token):
                    # a refused token leaves the matcher where it was: was any allowed?
                    self._fail(replica, seq, NO_CONTINUATION if not self.structured
                               .can_continue(request_id) else f"the sampled token {token} "
                               "does not follow its structured output")
                    break
                if self.structured.is_terminated(request_id):
                    if not seq.is_finished:
                        replica.scheduler.finish(seq, "stop")
                        ended.append(seq)
                    break
        return ended

    def _fail(self, replica: "Replica", seq: Sequence, reason: str) -> None:
        """Ends one request with finish reason "error"; its blocks are freed."""
        replica.scheduler.finish(seq, "error")
        self._prompt_logprobs.forget(seq.request_id)
        if self.structured.tracks(seq.request_id):
            replica.num_structured -= 1
        replica.encoder.forget(seq.request_id)
        self._report_failure(seq, reason)

    def _release(self, replica: "Replica", request_id: str) -> None:
        self._prompt_logprobs.forget(request_id)
        if self.speculator is not None:
            self.speculator.finish(request_id)
        if self.structured.tracks(request_id):
            self.structured.remove(request_id)
            replica.num_structured -= 1
        self.node.replica_of.pop(request_id, None)
        replica.encoder.forget(request_id)

    def stats(self) -> EngineStats:
        serving = self.node.serving_replicas()  # (replicas left behind share their blocks)
        counts = self._preemptions
        waiting = sum(r.scheduler.num_waiting for r in self.replicas) + len(self.node.unplaced)
        return EngineStats(sum(r.scheduler.num_running for r in self.replicas), waiting,
                           sum(r.block_manager.num_free_blocks for r in serving),
                           sum(r.block_manager.num_blocks for r in serving),
                           counts.preemptions, counts.swapped_out, counts.swapped_in,
                           counts.swap_bytes_out, counts.swap_bytes_in,
                           sum(s.slots.used_tokens for s in self.node.swap_spaces.values()),
                           counts.recompute_tokens, *self._spec_counts())

    def _spec_counts(self) -> tuple[int, int, int]:
        if self.speculator is None:
            return 0, 0, 0
        stats = self.speculator.stats
        return stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens

    def spec_decode_stats(self):
        """Speculative decoding's counts since start-up (SpecDecodeStats; None: off)."""
        return None if self.speculator is None else self.speculator.stats


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
