"""`parashift plan --recommend`: every static plan of the node's GPUs, Shift over every base
plan with SP, SiDP over every DP layout of plain TP replicas inside a host, Flying over the
same layouts, and Seesaw's pairs (offline workloads), each predicted from the cost model on
a bench workload: TTFT, TPOT, throughput and KV capacity; ranked by what the workload
measures (offline: throughput; online: a request's latency, TTFT + its output's TPOTs).

Offline workloads (all requests at t=0) run through continuous batching by events
(runs.offline_s); their TTFT is a prompt's on an idle node. Online workloads (arrivals at a rate) are a queue per
replica: the replica is busy prefilling a share rho of the time, its decode batch is the
requests in flight (Little's law), a prompt waits rho / (1 - rho) of a prefill; past
rho >= 1 the plan is overloaded (its TTFT grows without bound)."""
import math
from dataclasses import dataclass, field, replace

from parashift.bench.workloads import Workload, WorkloadOptions, build_phases, get_workload
from parashift.cost.advisor import Advisor
from parashift.cost.profile import load
from parashift.cost.runs import Engine, Served, kv_tokens, offline_s, prefill_s, step_s
from parashift.cost.sidp import SLOTS
from parashift.cost.seesaw_run import seesaw_s
from parashift.cost.shape import SHAPES, ModelShape, load_shape
from parashift.cost.step import StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan

PROFILES = SHAPES.parent / "results" / "profiles"
GPU_KINDS = {"h200": "h200"}
SAMPLE = 256  # requests drawn from an online workload for their lengths


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

    def score(self, offline: bool, mean_output: float) -> float:
        if offline:
            return -self.throughput
        return math.inf if self.overloaded else self.ttft_s + mean_output * self.tpot_s

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "ttft_ms": round(self.ttft_s * 1e3, 2),
                "tpot_ms": round(self.tpot_s * 1e3, 3), "throughput_tok_s": round(self.throughput),
                "kv_tokens": self.kv_tokens, "overloaded": self.overloaded, **self.detail}


@dataclass
class Recommendation:
    model: str
    gpus: int
    nnodes: int
    workload: str
    ranked: list[Prediction]
    refused: dict[str, str]
    notes: list[str]

    def as_dict(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "nnodes": self.nnodes,
                "workload": self.workload, "ranked": [p.as_dict() for p in self.ranked],
                "refused": self.refused, "notes": self.notes}


def node_model(shape: ModelShape, gpus_per_node: int, gpu_kind: str) -> StepModel:
    if gpu_kind not in GPU_KINDS:
        raise ValueError(f"no profile of GPU kind {gpu_kind!r}; known: {', '.join(GPU_KINDS)} "
                         "(measure one with `parashift profile --output FILE`)")
    compute = load(PROFILES / f"{GPU_KINDS[gpu_kind]}_compute.json")
    links = sorted(PROFILES.glob(f"{GPU_KINDS[gpu_kind]}x*_link.json"))
    link = None
    if gpus_per_node > 1 and links:
        fitting = [p for p in links if int(p.stem.split("x")[1].split("_")[0]) >= gpus_per_node]
        link = load(fitting[0] if fitting else links[-1])
    return StepModel(shape, compute, link)


def static_plans(gpus: int, gpus_per_node: int) -> list[Plan]:
    """Every dp x pp x sp x tp plan of the GPUs whose SP x TP group stays inside a host."""
    plans = []
    for dp in _divisors(gpus):
        for pp in _divisors(gpus // dp):
            for sp in _divisors(gpus // (dp * pp)):
                tp = gpus // (dp * pp * sp)
                if sp * tp <= gpus_per_node:
                    plans.append(Plan(dp=dp, pp=pp, sp=sp, tp=tp))
    return plans


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(shape: ModelShape, gpus: int, gpus_per_node: int, offline: bool
               ) -> tuple[list[Served | tuple[Plan, Plan]], dict[str, str]]:
    chosen, refused = [], {}
    for plan in static_plans(gpus, gpus_per_node):
        try:
            plan.check_model(shape.num_heads, shape.num_kv_heads, shape.num_layers,
                             shape.intermediate or None)
        except ValueError as e:
            refused[plan.name()] = str(e)
            continue
        chosen.append(Served(plan))
        if plan.sp > 1:
            chosen.append(Served.shift(plan))
        if plan.dp > 1 and plan.pp == plan.sp == 1 and plan.world_size <= gpus_per_node:
            sidp = Served.sidp(plan, None)
            if shape.moe or shape.fp8_weights:
                refused[sidp.name] = ("SiDP shares dense FFN weights in the model's dtype "
                                      "(no MoE experts, no FP8 weights)")
            else:
                chosen.append(sidp)
    if offline:
        for pp in _divisors(gpus)[1:]:
            prefill, decode = Plan(pp=pp, tp=gpus // pp), Plan(tp=gpus)
            if Served(prefill) in chosen and Served(decode) in chosen:
                chosen.append((prefill, decode))
    return chosen, refused


def workload_requests(workload: Workload, options: WorkloadOptions) -> tuple[list, float]:
    """(input, output) of a sample of the workload's requests, and their arrival rate
    (inf: all at t=0)."""
    phase = build_phases(workload, options)[0]
    # offline runs refill the scheduler's seats as requests end: their count matters, take all
    keep = len(phase.requests) if workload.offline else SAMPLE
    lengths = [(r.input_len, r.output_len) for r in phase.requests[:keep]]
    if workload.offline:
        return lengths, math.inf
    if workload.arrivals == "sequential":
        return lengths, 0.0
    times = [r.arrival_s for r in phase.requests]
    span = max(times) - min(times)
    return lengths, (len(times) - 1) / span if span > 0 else math.inf


def _with_threshold(advisor: Advisor, cand):
    """Shift at the model's crossover; SiDP at the model's B_th (where the predicted WaS
    step, its fetch at the link profile's peer rate, stops being slower than CaS's)."""
    if not isinstance(cand, Served):
        return cand
    if cand.decode is not None:
        return replace(cand, threshold=advisor.shift_threshold(cand.plan))
    if cand.ffn_owners > 1:
        return replace(cand, ffn_threshold=advisor.sidp_crossover(cand.plan.tp, cand.ffn_owners))
    return cand


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
    seats = max(1, min(engine.max_num_seqs, len(reqs) // served.plan.dp))
    tpot = step_s(model, served, StepBatch.decode(seats, int(mean_in)))
    return Prediction(served.name, kind_of(served),
                      prefill_s(model, served, int(mean_in), engine), tpot,
                      sum(i + o for i, o in reqs) / seconds,
                      kv_tokens(model, served) * served.plan.dp, detail=_detail(served))


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


def recommend(model_name: str, gpus: int, workload_name: str, nnodes: int = 1,
              gpu_kind: str = "h200", options: WorkloadOptions = WorkloadOptions(),
              quantization: str | None = None, kv_cache_dtype: str = "auto") -> Recommendation:
    if gpus < 1 or nnodes < 1 or gpus % nnodes:
        raise ValueError(f"--gpus {gpus} over --nnodes {nnodes}: give a multiple of the hosts")
    shape = load_shape(model_name).quantized(quantization, kv_cache_dtype)
    workload = get_workload(workload_name)
    per_node = gpus // nnodes
    model = node_model(shape, per_node, gpu_kind)
    reqs, rate = workload_requests(workload, options)
    engine = Engine()
    chosen, refused = candidates(shape, gpus, per_node, workload.offline)
    advisor = Advisor(model, max_seqs=engine.max_num_seqs)  # Shift at the model's crossover
    chosen = [_with_threshold(advisor, c) for c in chosen]
    ranked = []
    longest = max(i + o for i, o in reqs)
    for cand in chosen:
        name = cand.name if isinstance(cand, Served) else f"seesaw-{cand[0].name()}-{cand[1].name()}"
        served = cand if isinstance(cand, Served) else Served(cand[1])
        kv = kv_tokens(model, served)
        if kv < longest:
            weights = model.weight_bytes_per_rank(
                replica_plan(served.plan), ffn_owners=served.ffn_owners,
                ffn_slots=SLOTS if served.ffn_owners > 1 else 0) / 1e9
            refused[name] = (f"does not fit: {weights:.1f} GB of weights per GPU leave KV for "
                             f"{max(kv, 0):,} tokens a replica; the longest request needs {longest:,}")
            continue
        ranked.append(_predict(model, cand, name, reqs, rate, engine))
    ranked += flying_predictions(model, ranked, reqs, rate, engine, per_node)
    if not ranked:
        raise ValueError(f"no plan of {gpus} GPUs fits {model_name}: "
                         + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    mean_out = sum(o for _, o in reqs) / len(reqs)
    ranked.sort(key=lambda p: (p.score(workload.offline, mean_out), p.name))
    notes = [f"predicted from {len(reqs)} requests of `{workload_name}` (seed {options.seed}); "
             f"profiles: {model.compute.source.split(' by ')[0]}",
             "offline: throughput from continuous batching by events; TTFT of a mean prompt on "
             "an idle node"
             if workload.offline else f"online at {rate:.3g} req/s: a queue per replica"]
    if shape.fp8_weights or shape.kv_elem_bytes == 1:
        weights = "E4M3 linear weights" if shape.fp8_weights else "weights in the model's dtype"
        kv = "E4M3" if shape.kv_elem_bytes == 1 else "the model's dtype"
        notes.append(f"FP8: {weights} (the profile's FP8 GEMM fit); KV cache in {kv}")
    if nnodes > 1:
        notes.append("across hosts only PP and DP; no inter-host link profile is committed, so "
                     "a PP stage boundary between hosts is costed at the intra-host rate")
    if model.link is not None and model.link.ranks < per_node:
        notes.append(f"{per_node} GPUs a host: collectives scaled from the {model.link.ranks}-GPU "
                     "link profile by ring traffic (not measured at this size)")
    return Recommendation(model_name, gpus, nnodes, workload_name, ranked, refused, notes)


FLYING_MERGE_RUNNING = 4  # FlyingConfig.merge_running's default


def flying_predictions(model: StepModel, ranked: list[Prediction], reqs: list, rate: float,
                       engine: Engine, per_node: int) -> list[Prediction]:
    """Flying over each DP layout of plain TP replicas: the width its load rule picks. An
    offline queue splits at once (the DP layout's figures); online, a load whose requests in
    flight stay at or below merge_running runs merged (one TP group over every replica),
    else split."""
    out = []
    for dp_pred in [p for p in ranked if p.kind == "static"]:
        plan = Plan.parse(dp_pred.name)
        width = plan.dp * plan.tp
        if plan.dp < 2 or plan.pp > 1 or plan.sp > 1 or width > per_node:
            continue
        chosen, merged = dp_pred, None
        if not math.isinf(rate):
            merged = predict_online(model, Served(Plan(tp=width)), reqs, rate, engine)
            in_flight = dp_pred.detail.get("decode_batch", 0) * plan.dp
            if not dp_pred.overloaded and in_flight <= FLYING_MERGE_RUNNING:
                chosen = merged
        out.append(Prediction(f"flying-{dp_pred.name}", "flying", chosen.ttft_s, chosen.tpot_s,
                              chosen.throughput, dp_pred.kv_tokens, chosen.overloaded,
                              {"runs": "merged" if chosen is merged else "split"}))
    return out


def _predict(model, cand, name, reqs, rate, engine) -> Prediction:
    if isinstance(cand, tuple):
        seconds, parts = seesaw_s(model, cand[0], cand[1], reqs, 32 * 2 ** 30, engine)
        mean_in = sum(i for i, _ in reqs) / len(reqs)
        return Prediction(name, "seesaw", prefill_s(model, Served(cand[0]), int(mean_in), engine),
                          parts["decode"] / max(1, max(o for _, o in reqs)),
                          sum(i + o for i, o in reqs) / seconds,
                          model.kv_tokens(replica_plan(cand[1])),
                          detail={"switch_s": round(parts["switch"], 3)})
    if math.isinf(rate):
        return predict_offline(model, cand, reqs, engine)
    return predict_online(model, cand, reqs, rate, engine)


def render(rec: Recommendation) -> str:
    lines = [f"{rec.model} on {rec.gpus} GPUs ({rec.nnodes} host(s)), workload {rec.workload}:",
             f"{'rank':>4}  {'plan or policy':<24} {'TTFT ms':>10} {'TPOT ms':>9} "
             f"{'tok/s':>10} {'KV tokens':>12}"]
    for k, p in enumerate(rec.ranked, 1):
        ttft = "overload" if p.overloaded else f"{p.ttft_s * 1e3:.1f}"
        lines.append(f"{k:>4}  {p.name:<24} {ttft:>10} {p.tpot_s * 1e3:>9.3f} "
                     f"{p.throughput:>10,.0f} {p.kv_tokens:>12,}")
    lines += [f"      {name}: refused: {why}" for name, why in rec.refused.items()]
    lines += [f"note: {n}" for n in rec.notes]
    return "\n".join(lines)
