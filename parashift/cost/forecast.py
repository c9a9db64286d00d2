"""What a plan, a Shift or SiDP policy or a Seesaw pair is predicted to give on a workload,
from the step model: TTFT, TPOT, throughput and KV capacity, and the order a workload ranks
them in (offline: throughput; online: a request's latency, TTFT + its output's TPOTs). Used
by `plan --recommend` (planner/recommend.py) and by the start-up choices that must not lose
to a static plan (Seesaw's `auto`, SiDP's fallback; cost/plan_choice.py).

Offline workloads (all requests at t=0) run through continuous batching by events
(runs.offline_s); their TTFT is a prompt's on an idle node. Online workloads (arrivals at a
rate) are a queue per replica: the replica is busy prefilling a share rho of the time, its
decode batch is the requests in flight (Little's law), a prompt waits rho / (1 - rho) of a
prefill; past rho >= 1 the plan is overloaded (its TTFT grows without bound)."""
import math
from dataclasses import dataclass, field

from parashift.cost.forecast_trace import trace_figures
from parashift.cost.runs import (Engine, Served, cycle_s, kv_tokens, offline_s, prefill_s,
                                 stage_replicas, step_s)
from parashift.cost.seesaw_run import seesaw_s
from parashift.cost.sidp import SLOTS
from parashift.cost.step import StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan

SEESAW_TIER_BYTES = 32 * 2 ** 30  # a Seesaw group's CPU KV tier, where none is given

@dataclass
class Prediction:
    name: str
    kind: str                       # static | shift | seesaw
    ttft_s: float
    tpot_s: float
    throughput: float               # combined tokens a second
    kv_tokens: int
    overloaded: bool = False
    detail: dict = field(default_factory=dict)
    latency_s: float | None = None  # online from a trace: its requests' median latency

    def score(self, offline: bool, mean_output: float) -> float:
        if offline:
            return -self.throughput
        if self.overloaded:
            return math.inf
        if self.latency_s is not None:
            return self.latency_s
        return self.ttft_s + mean_output * self.tpot_s

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "ttft_ms": round(self.ttft_s * 1e3, 2),
                "tpot_ms": round(self.tpot_s * 1e3, 3), "throughput_tok_s": round(self.throughput),
                "kv_tokens": self.kv_tokens, "overloaded": self.overloaded, **self.detail}


def kind_of(served: Served) -> str:
    return "shift" if served.decode else "sidp" if served.ffn_owners > 1 else "static"


def _detail(served: Served) -> dict:
    if served.ffn_owners > 1:
        return {"b_th": served.ffn_threshold}
    return {}


def predict_offline(model: StepModel, served: Served, reqs: list, engine: Engine) -> Prediction:
    seconds = offline_s(model, served, reqs, engine)
    mean_in = sum(i for i, _ in reqs) / len(reqs)
    plan = replica_plan(served.plan)
    replicas = served.plan.dp * stage_replicas(served)
    seats = max(1, min(engine.max_num_seqs, len(reqs) // replicas))
    tpot = cycle_s(model, served, StepBatch.decode(seats, int(mean_in)))
    return Prediction(served.name, kind_of(served),
                      prefill_s(model, served, int(mean_in), engine), tpot,
                      sum(i + o for i, o in reqs) / seconds,
                      kv_tokens(model, served) * served.plan.dp, detail=_detail(served))


def predict_trace(model: StepModel, served: Served, reqs: list, arrivals: tuple,
                  engine: Engine) -> Prediction:
    """Online, from the requests' arrival times (cost/forecast_trace.py)."""
    f = trace_figures(model, served, reqs, arrivals, engine)
    mean_tokens = sum(i + o for i, o in reqs) / len(reqs)
    return Prediction(served.name, kind_of(served), math.inf if f.overloaded else f.ttft_s,
                      f.tpot_s, f.rate * mean_tokens, kv_tokens(model, served) * served.plan.dp,
                      f.overloaded, {"prefill_share": round(f.prefill_share, 3),
                                     "decode_batch": round(f.decode_batch, 1), "trace": True,
                                     **_detail(served)}, f.latency_s)


def predict_online(model: StepModel, served: Served, reqs: list, rate: float,
                   engine: Engine) -> Prediction:
    """A replica prefills a share rho = rate x prefill of its time and decodes the rest;
    its decode batch holds what is in flight (Little's law) and is interrupted by prompts
    (TPOT = step / (1 - rho)); a prompt waits for the prompts ahead (M/D/1) and half a step."""
    mean_in = sum(i for i, _ in reqs) / len(reqs)
    mean_out = sum(o for _, o in reqs) / len(reqs)
    dp = served.plan.dp
    prefill = prefill_s(model, served, int(mean_in), engine)
    per_replica = rate / dp
    rho = per_replica * prefill
    context = int(mean_in + mean_out / 2)
    kv = kv_tokens(model, served)
    batch, step = 1, step_s(model, served, StepBatch.decode(1, context))
    for _ in range(30):
        if rho >= 1:
            break
        batch = max(1, math.ceil(per_replica * mean_out * step / (1 - rho)))
        step = step_s(model, served, StepBatch.decode(min(batch, engine.max_num_seqs), context))
    overloaded = rho >= 1 or batch > engine.max_num_seqs or batch * context > kv
    if overloaded:
        seats = min(engine.max_num_seqs, max(1, kv // context))
        served_rate = dp * min(1 / prefill, seats / (mean_out * step + prefill))
        ttft = math.inf
    else:
        served_rate = rate
        ttft = prefill * (1 + rho / (2 * (1 - rho))) + step / 2
    tpot = step / (1 - min(rho, 0.999))
    return Prediction(served.name, kind_of(served), ttft, tpot,
                      served_rate * (mean_in + mean_out), kv * dp, overloaded,
                      {"prefill_share": round(rho, 3), "decode_batch": batch, **_detail(served)})


Candidate = Served | tuple[Plan, Plan]  # a plan or policy served, or a Seesaw (prefill, decode)


def candidate_name(cand: Candidate) -> str:
    return cand.name if isinstance(cand, Served) else f"seesaw-{cand[0].name()}-{cand[1].name()}"


def predict(model: StepModel, cand: Candidate, reqs: list, rate: float, engine: Engine,
            tier_bytes: float = SEESAW_TIER_BYTES, arrivals: tuple = ()) -> Prediction:
    """`cand` on requests `reqs` ((input, output) each) arriving at `rate` (inf: offline),
    or online at `arrivals` (their times, where known)."""
    name = candidate_name(cand)
    if isinstance(cand, tuple):
        seconds, parts = seesaw_s(model, cand[0], cand[1], reqs, tier_bytes, engine)
        mean_in = sum(i for i, _ in reqs) / len(reqs)
        return Prediction(name, "seesaw", prefill_s(model, Served(cand[0]), int(mean_in), engine),
                          parts["decode"] / max(1, max(o for _, o in reqs)),
                          sum(i + o for i, o in reqs) / seconds,
                          model.kv_tokens(replica_plan(cand[1])),
                          detail={"switch_s": round(parts["switch"], 3)})
    if math.isinf(rate):
        return predict_offline(model, cand, reqs, engine)
    if arrivals:
        return predict_trace(model, cand, reqs, arrivals, engine)
    return predict_online(model, cand, reqs, rate, engine)


def predict_all(model: StepModel, chosen: list[Candidate], reqs: list, rate: float,
                engine: Engine, tier_bytes: float = SEESAW_TIER_BYTES, arrivals: tuple = ()
                ) -> tuple[list[Prediction], dict[str, str]]:
    """Each candidate predicted, or refused (named, with why) where the longest request's
    KV does not fit one of its replicas."""
    predicted, refused = [], {}
    longest = max(i + o for i, o in reqs)
    for cand in chosen:
        name = candidate_name(cand)
        served = cand if isinstance(cand, Served) else Served(cand[1])
        kv = kv_tokens(model, served)
        if kv < longest:
            weights = model.weight_bytes_per_rank(
                replica_plan(served.plan), ffn_owners=served.ffn_owners,
                ffn_slots=SLOTS if served.ffn_owners > 1 else 0) / 1e9
            refused[name] = (f"does not fit: {weights:.1f} GB of weights per GPU leave KV for "
                             f"{max(kv, 0):,} tokens a replica; the longest request needs {longest:,}")
            continue
        predicted.append(predict(model, cand, reqs, rate, engine, tier_bytes, arrivals))
    return predicted, refused


def ranked(predictions: list[Prediction], offline: bool, reqs: list) -> list[Prediction]:
    """Best first: by throughput offline, by a request's latency online (ties by name)."""
    mean_out = sum(o for _, o in reqs) / len(reqs)
    return sorted(predictions, key=lambda p: (p.score(offline, mean_out), p.name))
