"""What a run of many steps takes under a plan or a Shift pair, from the step model:
`interactive` TTFT and TPOT (one request at a time) and offline throughput (all requests at
t=0, continuous batching over the scheduler's seats, prompts chunked by the step's budget).

A plan here is what serves: `Served(plan)` for a static plan, `Served(base, decode=shift
plan, threshold)` for Shift (steps of more tokens than the threshold run the base plan)."""
import math
from collections import deque
from dataclasses import dataclass

from parashift.cost.sidp import SLOTS, idle_cas_step, sidp_mode, sidp_step
from parashift.cost.step import Seq, StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan


@dataclass(frozen=True)
class Served:
    plan: Plan
    decode: Plan | None = None   # Shift's shift plan, for steps of <= threshold tokens
    threshold: int = 512
    label: str = ""
    ffn_owners: int = 1              # SiDP: replicas sharing FFN weights (1: none)
    ffn_threshold: int | None = None  # SiDP: B_th, tokens a replica from which WaS runs
    cas_graphs: bool = True          # SiDP's CaS decodes replay graphs (False: --no-cuda-graphs)
    stage_replicas: bool = True      # a pipelined group serves a replica per stage (not Seesaw)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.decode is None:
            return self.plan.name()
        return f"shift-{self.plan.name()}"

    def plan_for(self, tokens: int) -> Plan:
        if self.decode is not None and tokens <= self.threshold:
            return self.decode
        return self.plan

    @classmethod
    def shift(cls, base: Plan, threshold: int = 512) -> "Served":
        return cls(base, base.shift_plan(), threshold)

    @classmethod
    def sidp(cls, plan: Plan, threshold: int | None, cas_graphs: bool = True) -> "Served":
        """The sidp policy over `plan`'s DP replicas (plain TP), all sharing FFN weights
        (threshold None: CaS alone, `--share-ffn`); its CaS decodes replay graphs, its WaS
        steps run eagerly (`cas_graphs` False: every step eagerly, --no-cuda-graphs)."""
        return cls(plan, label=f"sidp-{plan.name()}", ffn_owners=plan.dp,
                   ffn_threshold=threshold, cas_graphs=cas_graphs)


@dataclass(frozen=True)
class Engine:
    """The scheduler's limits that shape a run."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384


def step_s(model: StepModel, served: Served, batch: StepBatch) -> float:
    plan = served.plan_for(batch.tokens)
    if served.ffn_owners > 1:
        mode = sidp_mode(batch.tokens, served.ffn_threshold)
        if not served.cas_graphs:
            model = model.eager()
        return sidp_step(model, plan, batch, served.ffn_owners, mode).total
    return model.step_s(replica_plan(plan), batch)


def stage_replicas(served: Served) -> int:
    """Replicas a group of the plan serves: one per pipeline stage (engine/node_replicas.py;
    where a part of the pool would not hold a whole sequence the engine keeps one replica
    with a step per stage in flight instead, which this counts the same), else one."""
    return served.plan.pp if served.stage_replicas and served.ffn_owners == 1 else 1


def cycle_s(model: StepModel, served: Served, batch: StepBatch) -> float:
    """How often one of a pipelined group's stage replicas steps while the others keep every
    stage busy (planner/sim_executor.py's rule): its step's latency, or each stage busy
    with the step of every replica in turn, whichever is longer."""
    plan = served.plan_for(batch.tokens)
    if stage_replicas(served) == 1 or plan.pp == 1:
        return step_s(model, served, batch)
    step = model.step(replica_plan(plan), batch)
    return max(step.total, plan.pp * step.stage_s)


def kv_tokens(model: StepModel, served: Served) -> int:
    """KV tokens one replica holds (more where it shares its FFN weights)."""
    shared = served.ffn_owners > 1
    return model.kv_tokens(replica_plan(served.plan), ffn_owners=served.ffn_owners,
                           ffn_slots=SLOTS if shared else 0)


def prefill_s(model: StepModel, served: Served, prompt: int, engine: Engine) -> float:
    """One prompt alone, in chunks of the step budget."""
    total, done = 0.0, 0
    while done < prompt:
        chunk = min(engine.max_num_batched_tokens, prompt - done)
        total += step_s(model, served, StepBatch.prefill(chunk, done))
        done += chunk
    return total


def interactive(model: StepModel, served: Served, prompt: int, output: int,
                engine: Engine = Engine()) -> tuple[float, float]:
    """(TTFT, TPOT) of one request on an idle node: its prefill, then its decode steps at
    their mean context."""
    ttft = prefill_s(model, served, prompt, engine)
    tpot = step_s(model, served, StepBatch.decode(1, prompt + output // 2))
    return ttft, tpot


def offline_s(model: StepModel, served: Served, requests: list[tuple[int, int]],
              engine: Engine = Engine()) -> float:
    """Seconds to serve `requests` (input, output) all at t=0: the replicas (DP's, and a
    pipelined group's one per stage, each over its part of the pool and stepping at
    `cycle_s`) share them evenly (the slowest replica's time); each admits up to
    max_num_seqs (or what its KV holds), prefills the admitted prompts in steps of the budget with its running decodes
    riding along, decodes until a sequence ends, and refills the seat it frees (continuous
    batching, event by event). Replicas sharing FFN weights step in rounds (`_rounds_s`)."""
    plan = served.plan
    kv = kv_tokens(model, served)
    if kv <= 0:
        raise ValueError(f"{served.name}: the weights leave no memory for the KV cache")
    parts = stage_replicas(served)
    shares = [requests[d::plan.dp * parts] for d in range(plan.dp * parts)]
    mean_len = sum(i + o for i, o in requests) / len(requests)
    seats = max(1, min(engine.max_num_seqs, int(kv // parts // mean_len)))
    timelines = [_replica_steps(model, served, share, engine, seats) for share in shares if share]
    if served.ffn_owners > 1:
        return _rounds_s(model, timelines)
    return max(sum(n * s for n, s, _ in steps) for steps in timelines)


def _rounds_s(model: StepModel, timelines: list[list[tuple[int, float, bool]]]) -> float:
    """Replicas sharing FFN weights step together: each round takes its slowest replica's
    step, and a CaS round a replica done with its share sits in serves its slices eagerly
    (`idle_cas_step`), which the others wait on at every layer."""
    idle = idle_cas_step(model).total
    left = [deque(steps) for steps in timelines]
    total = 0.0
    while any(left):
        heads = [steps[0] for steps in left if steps]
        rounds = min(n for n, _, _ in heads)
        cas = any(c for _, _, c in heads)
        total += rounds * max([s for _, s, _ in heads] + [idle] * (cas and len(heads) < len(left)))
        for steps in left:
            if steps:
                n, s, c = steps.popleft()
                if n > rounds:
                    steps.appendleft((n - rounds, s, c))
    return total


def _replica_steps(model: StepModel, served: Served, requests: list[tuple[int, int]],
                   engine: Engine, seats: int) -> list[tuple[int, float, bool]]:
    """A replica's steps over its share: (steps, seconds each, a CaS step), in order."""
    queue = deque(requests)
    running: list[list[int]] = []  # [output tokens left, context]
    timeline = []
    while queue or running:
        admitted = [queue.popleft() for _ in range(min(len(queue), seats - len(running)))]
        if admitted:
            timeline.append(_prefill_steps(model, served, admitted, running, engine))
            running += [[o - 1, i + 1] for i, o in admitted]
        running = [r for r in running if r[0] > 0]
        if not running:
            continue
        steps = min(r[0] for r in running)
        context = sum(r[1] for r in running) // len(running) + steps // 2
        timeline.append(_steps(model, served, steps, StepBatch.decode(len(running), context)))
        for r in running:
            r[0] -= steps
            r[1] += steps
        running = [r for r in running if r[0] > 0]
    return timeline


def _steps(model: StepModel, served: Served, count: int, batch: StepBatch
           ) -> tuple[int, float, bool]:
    cas = served.ffn_owners > 1 and sidp_mode(batch.tokens, served.ffn_threshold) == "cas"
    return count, cycle_s(model, served, batch), cas


def _prefill_steps(model: StepModel, served: Served, admitted: list[tuple[int, int]],
                   running: list[list[int]], engine: Engine) -> tuple[int, float, bool]:
    """The admitted prompts in steps of the budget left after the running decodes, which
    each take a token of every such step."""
    prompt_tokens = sum(i for i, _ in admitted)
    mean_prompt = prompt_tokens / len(admitted)
    budget = max(1, engine.max_num_batched_tokens - len(running))
    steps = math.ceil(prompt_tokens / budget)
    chunk = prompt_tokens / steps
    per_seq = max(1, round(chunk / mean_prompt))
    context = sum(r[1] for r in running) // max(1, len(running))
    seqs = tuple(_seq(round(chunk / per_seq), mean_prompt) for _ in range(per_seq))
    seqs += (Seq(1, context),) * len(running)
    for r in running:
        r[0] -= min(r[0], steps)
        r[1] += steps
    return _steps(model, served, steps, StepBatch(seqs))


def _seq(query: int, mean_prompt: float) -> Seq:
    """A prompt chunk, at the mean context a chunk of a prompt of this length starts at."""
    return Seq(max(1, query), int(max(0.0, mean_prompt - query) / 2))


def throughput(model: StepModel, served: Served, requests: list[tuple[int, int]],
               engine: Engine = Engine()) -> float:
    """Combined (input + output) tokens a second."""
    tokens = sum(i + o for i, o in requests)
    return tokens / offline_s(model, served, requests, engine)
