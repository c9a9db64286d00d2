"""An executor without devices: each step the engine submits takes the time the cost model
predicts for its batch under its plan, on a virtual clock; a replica's ranks are busy until
its step ends, and `wait_any` returns the steps that end first (a discrete-event run).
Sampled tokens are a constant (the simulated requests ignore EOS).

Transitions cost what the engine itself does around them (drains, recomputed prompts run
as steps); their prepare and commit phases are views here (Flying's zero-copy weights) and
take no time. Seesaw's KV and weight moves are not simulated. A SiDP plan's step is the cost
model's SiDP step (cost/sidp.py: CaS exchanges, WaS fetches), and a CaS step starts once every
sharing replica's ranks are free, with the round's other steps (its FFN exchanges run on
all of them); a replica with no tokens in the round serves its slices eagerly
(`idle_cas_step`)."""
import heapq
import itertools
from typing import NoReturn

from parashift.cost.sidp import SLOTS, idle_cas_step, sidp_step
from parashift.cost.step import Breakdown, Seq, StepBatch, StepModel, replica_plan
from parashift.executor.base import RanksNeverLost, WorkerFailure
from parashift.parallel.plan import Plan

SAMPLED_TOKEN = 7


def replica_kv_tokens(model: StepModel, plan: Plan) -> int:
    """KV tokens one replica of `plan` holds (a SiDP replica: beside 1/d of the FFN weights
    and the slots' share, as cost/forecast.py counts it)."""
    if plan.shared_ffn is None:
        return model.kv_tokens(replica_plan(plan))
    return model.kv_tokens(replica_plan(plan), ffn_owners=plan.ffn_replicas, ffn_slots=SLOTS)


def _is_was(plan: Plan) -> bool:
    return plan.shared_ffn is not None and plan.shared_ffn[0] == "was"


class VirtualClock:
    """time.time / monotonic / perf_counter for the engine's modules while it runs."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def time(self) -> float:
        return self.now

    monotonic = perf_counter = time

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class SimulatedExecutor(RanksNeverLost):
    def __init__(self, model: StepModel, clock: VirtualClock, plans: list[Plan],
                 layout_plans: list[Plan], block_size: int, num_blocks: int | None = None,
                 cuda_graphs: bool | None = None):
        self.model, self.clock = model, clock
        self.plans = {plan.name(): plan for plan in plans}
        self.eager_model = model.eager()
        # decode steps replay CUDA graphs unless --no-cuda-graphs (worker/model_runner.py
        # `graphs_by_default`); SiDP's WaS plans run eagerly beside them (`step_breakdown`)
        self.graphs = cuda_graphs is not False
        world = max(r for plan in layout_plans for r in plan.ranks) + 1
        self.rank_blocks = [0] * world
        for plan in layout_plans:
            tokens = replica_kv_tokens(model, plan) if num_blocks is None else None
            for rank in plan.ranks:
                self.rank_blocks[rank] = num_blocks if tokens is None else tokens // block_size
        self.load_seconds = 0.0
        self.failure: WorkerFailure | None = None
        self.lost: dict[int, str] = {}
        self.busy_until = [0.0] * world
        self._events: list = []
        self._order = itertools.count()
        self._round_starts: dict[int, float] = {}  # the round in flight's start
        self.steps: list[dict] = []  # every step: replica tag's index, plan, tokens, times

    @property
    def alive(self) -> list[int]:
        return list(range(len(self.rank_blocks)))

    @property
    def local_runner(self):
        return None

    def step_seconds(self, plan_name: str, batch) -> float:
        return self.step_breakdown(plan_name, batch).total

    def step_breakdown(self, plan_name: str, batch) -> Breakdown:
        seqs = [Seq(1, start) for start in batch.decode_starts]
        seqs += [Seq(len(c.token_ids), c.start_pos) for c in batch.chunks]
        plan = self.plans[plan_name] if plan_name in self.plans else Plan.parse(plan_name)
        model = self.model if self.graphs and not _is_was(plan) else self.eager_model
        if plan.shared_ffn is not None and not seqs and plan.shared_ffn[0] == "cas":
            return idle_cas_step(model)
        if plan.shared_ffn is not None:
            return sidp_step(model, plan, StepBatch(tuple(seqs)), plan.ffn_replicas,
                             plan.shared_ffn[0])
        return model.step(replica_plan(plan), StepBatch(tuple(seqs)))

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch) -> None:
        step = self.step_breakdown(batch.plan, batch)
        plan = self.plans.get(batch.plan)
        if plan is not None and plan.pp > 1:
            start, end = self._pipelined(step, ranks, plan.pp)
        else:
            start = self._start_of(batch, ranks)
            end = start + step.total
            for rank in ranks:
                self.busy_until[rank] = end
        sampled = len(batch.decode_ids) + sum(1 for c in batch.chunks if c.samples)
        self.steps.append({"ranks": list(ranks), "plan": batch.plan, "start_s": start,
                           "end_s": end, "decodes": len(batch.decode_ids),
                           "chunks": [(c.request_id, len(c.token_ids), c.start_pos)
                                      for c in batch.chunks]})
        heapq.heappush(self._events, (end, next(self._order), tag, [SAMPLED_TOKEN] * sampled))

    def _pipelined(self, step: Breakdown, ranks: tuple[int, ...], stages: int
                   ) -> tuple[float, float]:
        """A pipelined step's start and end: each stage's ranks take it once free and one
        micro-batch after the stage before (so a replica per stage keeps every stage busy);
        the last stage holds it to the step's end (its head)."""
        width = len(ranks) // stages
        start = previous = self.clock.now
        for k in range(stages):
            stage_ranks = ranks[k * width:(k + 1) * width]
            begin = max([previous + (step.lag_s if k else 0.0)]
                        + [self.busy_until[r] for r in stage_ranks])
            start = begin if k == 0 else start
            last = k == stages - 1
            until = begin + (step.total - (stages - 1) * step.lag_s if last else step.stage_s)
            for rank in stage_ranks:
                self.busy_until[rank] = until
            previous = begin
        return start, until

    def _start_of(self, batch, ranks: tuple[int, ...]) -> float:
        """When a step starts: once its ranks are free; a round's steps (SiDP's CaS, whose
        FFN exchanges run on every sharing replica) together, once all their ranks are."""
        plan = self.plans.get(batch.plan)
        if batch.round_id < 0 or plan is None or plan.shared_ffn is None:
            return max([self.clock.now] + [self.busy_until[r] for r in ranks])
        if batch.round_id not in self._round_starts:
            self._round_starts = {batch.round_id: max(
                [self.clock.now] + [self.busy_until[r] for r in plan.shared_ffn[1]])}
        return self._round_starts[batch.round_id]

    def wait_any(self) -> list[tuple[object, object]]:
        """Every step ended by the first end (as the real executors return every result
        ready, not one of steps that end together)."""
        end, _, tag, tokens = heapq.heappop(self._events)
        self.clock.now = max(self.clock.now, end)
        done = [(tag, (tokens, None, {}))]
        while self._events and self._events[0][0] <= self.clock.now:
            _, _, tag, tokens = heapq.heappop(self._events)
            done.append((tag, (tokens, None, {})))
        return done

    def transition(self, ranks, verb: str, plan_names, epoch: int = 0) -> float:
        return 0.0

    def seesaw_move(self, ranks, verb, plan_names, moves, tier) -> NoReturn:
        raise ValueError("the simulator does not run Seesaw's KV and weight moves")

    def collective_rpc(self, method: str, *args) -> list:
        return [None] * len(self.rank_blocks)

    def shutdown(self) -> None:
        self._events.clear()
