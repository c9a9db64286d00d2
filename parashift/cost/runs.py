"""What a run of many steps takes under a plan or a Shift pair, from the step model:
`interactive` TTFT and TPOT (one request at a time) and offline throughput (all requests at
t=0, in waves of the scheduler's seats, prompts chunked by the step's token budget).

A plan here is what serves: `Served(plan)` for a static plan, `Served(base, decode=shift
plan, threshold)` for Shift (steps of more tokens than the threshold run the base plan)."""
import math
from dataclasses import dataclass

from parashift.cost.step import Seq, StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan


@dataclass(frozen=True)
class Served:
    plan: Plan
    decode: Plan | None = None   # Shift's shift plan, for steps of <= threshold tokens
    threshold: int = 512
    label: str = ""

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


@dataclass(frozen=True)
class Engine:
    """The scheduler's limits that shape a run."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384


def step_s(model: StepModel, served: Served, batch: StepBatch) -> float:
    plan = served.plan_for(batch.tokens)
    return model.step_s(replica_plan(plan), batch)


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
    """Seconds to serve `requests` (input, output) all at t=0: the DP replicas share them
    evenly; each replica admits up to max_num_seqs (or what its KV holds) at a time, prefills
    their prompts in steps of the budget, then decodes them together; a sequence that ends
    frees its seat for the next wave (waves by sorted output length)."""
    plan = served.plan
    dp = plan.dp
    kv = model.kv_tokens(replica_plan(plan))
    if kv <= 0:
        raise ValueError(f"{served.name}: the weights leave no memory for the KV cache")
    mine = requests[::dp]
    mean_len = sum(i + o for i, o in mine) / len(mine)
    seats = max(1, min(engine.max_num_seqs, int(kv // mean_len)))
    total = 0.0
    for start in range(0, len(mine), seats):
        total += _wave_s(model, served, mine[start:start + seats], engine)
    return total


def _wave_s(model: StepModel, served: Served, wave: list[tuple[int, int]],
            engine: Engine) -> float:
    prompt_tokens = sum(i for i, _ in wave)
    mean_prompt = prompt_tokens / len(wave)
    budget = engine.max_num_batched_tokens
    steps = math.ceil(prompt_tokens / budget)
    chunk = prompt_tokens / steps
    per_seq = max(1, round(chunk / mean_prompt))
    seqs = StepBatch(tuple(_seq(round(chunk / per_seq), mean_prompt) for _ in range(per_seq)))
    total = steps * step_s(model, served, seqs)
    outputs = sorted(o for _, o in wave)
    previous = 0
    for k, out in enumerate(outputs):  # the batch shrinks as sequences end
        if out > previous:
            mid = int(mean_prompt + (previous + out) / 2)
            total += (out - previous) * step_s(model, served,
                                               StepBatch.decode(len(outputs) - k, mid))
            previous = out
    return total


def _seq(query: int, mean_prompt: float) -> Seq:
    """A prompt chunk, at the mean context a chunk of a prompt of this length starts at."""
    return Seq(max(1, query), int(max(0.0, mean_prompt - query) / 2))


def throughput(model: StepModel, served: Served, requests: list[tuple[int, int]],
               engine: Engine = Engine()) -> float:
    """Combined (input + output) tokens a second."""
    tokens = sum(i + o for i, o in requests)
    return tokens / offline_s(model, served, requests, engine)
