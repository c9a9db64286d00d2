"""The node: its layout of groups and their replicas, where each request goes, which replicas
step in a round and under which plan, what the policy sees, the transitions it commits and
the groups it takes out of service when a rank is lost. The engine's loop (llm_engine.py)
asks; the node changes here only, in `Node` and the files it hands work over to:
node_replicas.py (replicas over the ranks' pools), node_view.py (the policy's view),
node_transitions.py (merges, splits, re-shards) and node_faults.py (losses). None of them
calls the engine back: what the engine must still do with a request (queue it with its
outputs, or fail it) is returned to it."""
import logging
from collections import deque
from dataclasses import dataclass

from parashift.config import SchedulerConfig
from parashift.deterministic.reduction import check_plans
from parashift.engine import node_faults, node_transitions
from parashift.engine.faults import FaultReport
from parashift.engine.node_healing import Healing
from parashift.engine.node_rebalance import Rebalancing
from parashift.engine.node_reform import Reforming
from parashift.engine.node_replicas import make_replica, replica_pools
from parashift.engine.node_view import node_view
from parashift.engine.policy import Decision, NodeView, Policy, make_policy
from parashift.engine.policy.forced import ForcedWidth
from parashift.engine.policy.widths import (base_replicas, layout_report, layouts_by_width,
                                            width_of)
from parashift.engine.replica import Replica
from parashift.engine.routing import Slot, group_capacity, max_context_by_width, need, route
from parashift.engine.seesaw import make_tiers
from parashift.engine.sequence import Sequence
from parashift.engine.transitions import TransitionRecord, Transitions
from parashift.executor.base import TransitionAborted
from parashift.kv.cpu_tier import TierShape
from parashift.quantization import kv_cache_torch_dtype
from parashift.parallel.layout import coupled_groups
from parashift.parallel.plan import Plan

logger = logging.getLogger(__name__)


@dataclass
class Round:
    """What steps in one round: the policy's decision, the replicas of each set of coupled
    groups ready to step together, and the other replicas with work and room."""
    decision: Decision
    together: list[list[Replica]]
    alone: list[Replica]


class Node:
    """Made in two stages: the layout, policy and Seesaw tiers first (the executor starts
    the ranks from them), then, once the ranks report their pools, the replicas (`start`)."""

    def __init__(self, config, hf_config, dtype, max_model_len: int):
        self.config, self.hf_config, self.max_model_len = config, hf_config, max_model_len
        self.layout = config.node_layout  # the starting layout: each rank's weights and KV
        self.policy: Policy = make_policy(config, self.layout, hf_config)
        self.policy_plans = list(self.policy.plans)  # made on every rank at start-up
        self.plans_by_name = {p.name(): p for p in self.policy_plans}
        if config.deterministic:
            check_plans(hf_config, [*self.layout.plans, *self.policy_plans])
        # the plan each rank loaded its weights and laid its KV pool out for
        self.loaded = {r: plan.loaded_plan(r) for plan in self.layout.plans for r in plan.ranks}
        self.kv_heads = hf_config.num_key_value_heads
        # seesaw: each group's CPU KV tier, by its ranks; its re-shards change pipeline stages
        kv_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, dtype)  # the pool's, moved as is
        self.seesaw = make_tiers(config, self.layout, getattr(self.policy, "pairs", ()),
                                 hf_config, kv_dtype, self.need)
        self.transitions = Transitions(stage_changes=bool(self.seesaw))
        self.epoch = 0  # transitions committed
        self.steps_in_flight = 2 if async_scheduling(config, self.policy_plans) else 1
        self.tier_shape = TierShape.of_model(hf_config, kv_dtype)
        self.swap_spaces: dict = {}  # by ranks: each group's CPU tier (swap preemption)
        self.replicas: list[Replica] = []
        self.replica_of: dict[str, Replica] = {}  # where each placed request is
        self.unplaced: dict[str, Sequence] = {}  # requests no group holds yet (routing.py)
        self.round_id = 0  # steps that coupled groups run together (SiDP's CaS)
        # each plan's last decode step (a token per sequence), or its last step before one
        self.last_step_s: dict[str, float] = {}
        self.decode_s: dict[str, object] = {}  # each plan's last decode steps' seconds (deques)
        self.prefill_rate: dict[str, float] = {}  # each plan's prompt tokens/s per rank
        self.layouts_by_width = layouts_by_width(base_replicas(self.layout),
                                                 set(self.plans_by_name))
        self.faults = FaultReport(self.layout.world_size, len(self.layout.plans))
        # rank sets that share communicators: all, until a lost group is replaced
        self.worlds = [frozenset(range(self.layout.world_size))]
        self.healing = Healing(self, config.max_worker_restarts)
        self.reforming = Reforming(self)
        self.rebalancing = Rebalancing(self)
        self.max_context: dict[int, int] = {}
        self.executor = None

    def start(self, executor, eos_ids: set[int]) -> None:
        """The replicas over the pools the executor's ranks report; the longest context of
        each width (refuses a max_model_len that no layout holds)."""
        self.executor, self.eos_ids = executor, eos_ids
        config = self.config
        self.scheduler_config = SchedulerConfig(
            config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
            config.long_prefill_token_threshold, config.enable_chunked_prefill)
        self.replicas = [make_replica(self, group, size, offset)
                         for group, offset, size in replica_pools(self)]
        self.max_context = self.max_context_by_width()

    def close(self) -> None:
        for tier in [*self.seesaw.values(), *self.swap_spaces.values()]:
            tier.close()
        self.seesaw, self.swap_spaces = {}, {}

    # ---- replicas ---------------------------------------------------------------
    def serving_replicas(self) -> list[Replica]:
        """The replicas of the layout's groups (those that admit requests)."""
        return [r for r in self.replicas if not r.is_left_behind]

    def drop_finished_left_behind(self) -> None:
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

    # ---- context by width -------------------------------------------------------
    def max_context_by_width(self, check: bool = True) -> dict[int, int]:
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
            return group_capacity(plan, rank_blocks, self.loaded, self.kv_heads,
                                  self.config.block_size)
        return max_context_by_width(self.layouts_by_width, self.plans_by_name, capacity)

    def check_tier_fits(self, tokens: int) -> None:
        """Under seesaw a request's KV passes through its group's CPU tier whole."""
        capacity = min((t.slots.capacity for t in self.seesaw.values()), default=tokens)
        if tokens > capacity:
            raise ValueError(f"the request may reach {tokens} tokens (prompt + max_tokens), more "
                             f"than the CPU KV tier holds ({capacity}): lower max_tokens or "
                             "raise cpu_kv_tokens")

    # ---- routing ----------------------------------------------------------------
    def need(self, seq: Sequence) -> int:
        return need(seq.num_prompt_tokens, seq.params.max_tokens, self.max_model_len)

    def holds(self, request_id: str) -> bool:
        return request_id in self.replica_of or request_id in self.unplaced

    def route(self, seq: Sequence) -> Replica | None:
        """The serving replica that takes `seq` (routing.py); None while no group holds it."""
        serving = self.serving_replicas()
        slots = [Slot(r.load, r.group, width_of(self.layout.plans[r.group]),
                      r.scheduler.config.max_model_len) for r in serving]
        index = route(slots, self.need(seq), seq.priority)
        return None if index is None else serving[index]

    def hold(self, seq: Sequence) -> None:
        """A request no group holds waits, unplaced, for the policy to merge one."""
        self.unplaced[seq.request_id] = seq
        self.decide_now()

    def admit(self, seq: Sequence, replica: Replica, now: float) -> None:
        replica.scheduler.add(seq)
        replica.arrivals.append(now)
        self.replica_of[seq.request_id] = replica

    def take_placeable(self) -> list[tuple[Sequence, Replica]]:
        """The unplaced requests that a group of the layout now holds, with it, for the
        engine to queue (then it asks the policy again for the others)."""
        placed = []
        for request_id, seq in list(self.unplaced.items()):
            replica = self.route(seq)
            if replica is not None:
                del self.unplaced[request_id]
                placed.append((seq, replica))
        return placed

    def requests(self):
        """Every request the node holds, placed or not."""
        yield from self.unplaced.values()
        for replica in self.replicas:
            yield from replica.scheduler.running
            yield from replica.scheduler.waiting

    # ---- the policy -------------------------------------------------------------
    def view(self) -> NodeView:
        """The node as policies see it (node_view.py)."""
        return node_view(self)

    def decide_now(self) -> bool:
        """Asks the policy for transitions outside a round (a request waits for one, or the
        node is idle); True if it asked for some."""
        decision = self.policy.decide(self.view())
        if decision.transitions:
            self.transitions.request(decision.transitions, self.layout, self.plans_by_name)
        return bool(decision.transitions)

    def set_policy(self, policy: Policy) -> None:
        """Replaces the policy (benchmarks, tests); it may pick only plans made at start-up."""
        made = {p.name() for p in self.policy_plans}
        unknown = [p.name() for p in policy.plans if p.name() not in made]
        if unknown:
            raise ValueError(f"plans {unknown} were not made at start-up (made: {sorted(made)})")
        self.policy = policy

    def forced_width(self) -> int | None:
        return self.policy.width if isinstance(self.policy, ForcedWidth) else None

    def set_layout(self, width: int | None) -> None:
        """Forces every aligned group of `width` replicas to merge; None hands the layout
        back to the policy (LLMEngine.set_layout)."""
        longest = max((self.need(seq) for seq in self.requests()), default=0)
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

    def layout_info(self) -> dict:
        return layout_report(self.layout, self.forced_width(), self.layouts_by_width,
                             self.max_context)

    # ---- rounds -----------------------------------------------------------------
    def next_round(self) -> Round | None:
        """Asks the policy for every group's next plan (before scheduling) and the
        transitions it wants; the replicas that may step now, None if none may."""
        open_replicas = self._open_replicas()
        if not open_replicas:
            return None
        reads_view = getattr(self.policy, "reads_view", True)
        decision = self.policy.decide(self.view() if reads_view else NodeView(()))
        if decision.transitions:
            self.transitions.request(decision.transitions, self.layout, self.plans_by_name)
            open_replicas = self._open_replicas()
        coupled = coupled_groups([self.plans_by_name.get(name) for name in decision.plans])
        together = {g for groups in coupled for g in groups}
        return Round(decision, [r for r in map(self._ready_together, coupled) if r],
                     [r for r in open_replicas if r.group not in together])

    def _ready_together(self, groups: tuple[int, ...]) -> list[Replica]:
        """The replicas of coupled `groups` (they share FFN weights in Compute-as-a-Service:
        every rank of theirs takes part in each step), once each has room and one has work."""
        replicas = [r for r in self.serving_replicas() if r.group in groups]
        if (any(len(r.in_flight) >= self.steps_in_flight_of(r) for r in replicas)
                or not any(r.scheduler.has_unfinished() for r in replicas)):
            return []
        return replicas

    def new_round_id(self) -> int:
        self.round_id += 1
        return self.round_id

    def _open_replicas(self) -> list[Replica]:
        """Replicas with work and room for a step, none of whose ranks a pending transition
        is draining. Under hard preemption a replica left behind waits while a group on its
        ranks has a request more urgent than all of its own. None while the node re-forms
        one world (node_reform.py) or shares the waiting requests with a group back in
        service (node_rebalance.py)."""
        if self.reforming.wanted or self.rebalancing.wanted:
            return []
        paused = {r for g in self.transitions.paused_groups() for r in self.layout.plans[g].ranks}
        urgency = self._urgency_by_rank() if any(r.yields for r in self.replicas) else {}
        return [r for r in self.replicas
                if len(r.in_flight) < self.steps_in_flight_of(r) and r.scheduler.has_unfinished()
                and paused.isdisjoint(r.ranks) and not (r.yields and _outranked(r, urgency))]

    def _urgency_by_rank(self) -> dict[int, int]:
        """Each rank's most urgent request priority among the serving groups on it."""
        urgency = {}
        for replica in self.serving_replicas():
            priority = replica.scheduler.most_urgent()
            for rank in replica.ranks if priority is not None else ():
                urgency[rank] = min(priority, urgency.get(rank, priority))
        return urgency

    def plan_for(self, replica: Replica, decision: Decision) -> Plan:
        """The plan of the replica's next step: the policy's for its group, or the plan its
        requests were written in once it was left behind."""
        name = replica.left_plan if replica.is_left_behind else decision.plans[replica.group]
        plan = self.plans_by_name.get(name)
        if plan is None or plan.ranks != replica.ranks:
            raise ValueError(f"the policy chose plan {name!r} for group {replica.group}, "
                             f"which runs on ranks {list(replica.ranks)}")
        return plan

    def steps_in_flight_of(self, replica: Replica) -> int:
        """A structured-output request's next mask needs its last token: one step at a
        time. A replica in a plan of several stages that is its group's only one (Seesaw's
        prefill plan, or a static pipeline whose pool holds no replica per stage) keeps a
        step per stage in flight, steps without placeholders (LLMEngine._schedule), so that
        each stage has work; static pipelines run a replica per stage, one step each;
        one-stage plans keep two in flight under async scheduling."""
        if replica.num_structured:
            return 1
        stages = self.stages(replica)
        if stages > 1:
            alone = replica.group is not None and sum(
                r.group == replica.group for r in self.replicas) == 1
            return stages if alone else 1
        return self.steps_in_flight

    def schedules_ahead(self, replica: Replica) -> bool:
        """Whether its next step may be scheduled while one runs, with placeholders for
        the tokens on their way (async scheduling in a plan of one stage)."""
        return self.steps_in_flight_of(replica) > 1 and self.stages(replica) == 1

    def stages(self, replica: Replica) -> int:
        """The pipeline stages of the replica's plan (its group's plan, or the plan it was
        left behind in; a change of plan drains its steps first)."""
        name = replica.left_plan if replica.is_left_behind else None
        plan = self.plans_by_name[name] if name else self.layout.plans[replica.group]
        return plan.pp

    def forgets_to_send(self, replica: Replica, finished: list[str],
                        new_params: dict) -> list[str]:
        """The ids its ranks may forget now. A replica sends its queue of forgets only with
        its next step, and a move queues one on every group it makes (a group left behind
        can step long after): a forget of a request that a replica on some of the same
        ranks has sent since waits in the queue until the request ends."""
        ranks, send, wait = set(replica.ranks), [], []
        for request_id in finished:
            holder = self.replica_of.get(request_id)
            stale = (holder is not None and request_id in holder.encoder.sent_blocks
                     and not ranks.isdisjoint(holder.ranks)
                     and not (holder is replica and request_id in new_params))
            (wait if stale else send).append(request_id)
        replica.encoder.finished += wait
        return send

    def note_step(self, replica: Replica, plan: str, num_tokens: int, num_chunks: int,
                  seconds: float) -> None:
        """A finished step's time, as the policy reads it: the plan's prefill rate (from a
        step of enough prompt tokens), its decode steps' times, a seesaw group's phase."""
        if num_tokens - num_chunks >= PREFILL_RATE_MIN_TOKENS and seconds > 0:
            ranks = len(self.plans_by_name[plan].ranks) if plan in self.plans_by_name else 1
            self.prefill_rate[plan] = num_tokens / seconds / ranks
        tier = self.seesaw.get(tuple(sorted(replica.ranks))) if self.seesaw else None
        if tier is not None:
            tier.seconds["prefill" if plan == tier.prefill.name() else "decode"] += seconds
        decode = num_tokens == num_chunks
        if decode:
            self.decode_s.setdefault(plan, deque(maxlen=DECODE_STEPS_KEPT)).append(seconds)
        if decode or plan not in self.decode_s:
            self.last_step_s[plan] = seconds

    # ---- changes of the layout --------------------------------------------------
    def commit_drained(self) -> list[TransitionRecord]:
        """Commits each pending transition whose groups' ranks have no step in flight (of
        any replica): its ranks prepare, then commit at this step boundary."""
        busy = {rank for r in self.replicas if r.in_flight for rank in r.ranks}
        in_flight = {g for g, plan in enumerate(self.layout.plans) if busy.intersection(plan.ranks)}
        records = []
        for pending in self.transitions.take_drained(in_flight):
            try:
                records.append(node_transitions.commit(self, pending))
            except TransitionAborted as e:  # its ranks are lost: take_losses isolates them
                logger.error("%s of group(s) %s aborted: %s", pending.transition.kind,
                             list(pending.transition.groups), e)
        return records

    def add_stashes(self, replica: Replica, sched, batch) -> None:
        """A seesaw group's prompts done, written to its tier with its step (node_transitions)."""
        node_transitions.add_stashes(self, replica, sched, batch)

    def take_losses(self) -> list[tuple[Sequence, str]]:
        """Takes the groups of the ranks the executor lost out of service (node_faults.py)
        and brings back those replaced (node_healing.py); the requests that no group left can hold, with why, for the engine to fail. Raises
        WorkerFailure once the executor has failed."""
        if self.executor.failure is not None:
            raise self.executor.failure
        lost = self.executor.take_lost()
        failed = node_faults.isolate(self, lost) if lost else []
        self.healing.tick()  # node_healing.py: lost groups replaced
        self.reforming.tick()  # node_reform.py: their worlds joined again
        self.rebalancing.tick()  # node_rebalance.py: the waiting requests shared with them
        return failed


def _outranked(replica: Replica, urgency: dict[int, int]) -> bool:
    """Whether a group on the replica's ranks has a request more urgent than its own
    (a paused replica would otherwise wait as long as requests keep arriving)."""
    own = replica.scheduler.most_urgent()
    return own is not None and any(urgency.get(rank, own) < own for rank in replica.ranks)


def async_scheduling(config, plans: list[Plan]) -> bool:
    """On by default for the plans of one stage: their next step carries placeholders for
    the tokens on their way. A pipeline's first stage never sees those tokens, so its steps
    overlap only without placeholders (`steps_in_flight_of`); asked for where every plan is
    pipelined, an error."""
    if config.async_scheduling is None:  # off with speculation: a drafting sequence waits
        # for its tokens (Speculator.propose), so it would step every other step
        return config.speculative_config is None and any(plan.pp == 1 for plan in plans)
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
