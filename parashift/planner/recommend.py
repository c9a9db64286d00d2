"""`parashift plan --recommend`: every static plan of the node's GPUs, Shift over every base
plan with SP, SiDP over every DP layout of plain TP replicas inside a host, Flying over the
same layouts, and Seesaw's pairs (offline workloads), each predicted from the cost model on
a bench workload: TTFT, TPOT, throughput and KV capacity; ranked by what the workload
measures (offline: throughput; online: a request's latency, TTFT + its output's TPOTs).

The predictions and their order: cost/forecast.py."""
import math
from dataclasses import dataclass, replace

from parashift.bench.workloads import Workload, WorkloadOptions, build_phases, get_workload
from parashift.cost.advisor import Advisor
from parashift.cost.forecast import Prediction, predict, predict_all, ranked
from parashift.cost.links import choose_link
from parashift.cost.plan_choice import fitting_plans, static_plans  # noqa: F401 (re-exported)
from parashift.cost.profile import load
from parashift.cost.runs import Engine, Served
from parashift.cost.shape import SHAPES, ModelShape, load_shape
from parashift.cost.step import StepModel
from parashift.parallel.plan import Plan

PROFILES = SHAPES.parent / "results" / "profiles"
GPU_KINDS = {"h200": "h200"}
SAMPLE = 256  # requests drawn from an online workload for their lengths


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


def node_model(shape: ModelShape, gpus_per_node: int, gpu_kind: str,
               link: str = "nvlink") -> StepModel:
    """`link`: nvlink, pcie or a link profile's JSON file (cost/links.py)."""
    if gpu_kind not in GPU_KINDS:
        raise ValueError(f"no profile of GPU kind {gpu_kind!r}; known: {', '.join(GPU_KINDS)} "
                         "(measure one with `parashift profile --output FILE`)")
    compute = load(PROFILES / f"{GPU_KINDS[gpu_kind]}_compute.json")
    return StepModel(shape, compute, choose_link(PROFILES, GPU_KINDS[gpu_kind], gpus_per_node,
                                                 link))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(shape: ModelShape, gpus: int, gpus_per_node: int, offline: bool
               ) -> tuple[list[Served | tuple[Plan, Plan]], dict[str, str]]:
    chosen = []
    plans, refused = fitting_plans(shape, gpus, gpus_per_node)
    for plan in plans:
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


def workload_arrivals(workload: Workload, options: WorkloadOptions) -> tuple[float, ...]:
    """The arrival times of `workload_requests`' sample, one a request (its trace), or ()
    where the workload has none to read: offline (all at t=0) or sequential."""
    if workload.offline or workload.arrivals == "sequential":
        return ()
    return tuple(r.arrival_s for r in build_phases(workload, options)[0].requests[:SAMPLE])


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


def recommend(model_name: str, gpus: int, workload_name: str, nnodes: int = 1,
              gpu_kind: str = "h200", options: WorkloadOptions = WorkloadOptions(),
              quantization: str | None = None, kv_cache_dtype: str = "auto",
              link: str = "nvlink", trace: bool = True) -> Recommendation:
    """`trace`: an online workload is forecast from its requests' arrival times
    (cost/forecast_trace.py; ranked by their median latency), else from its mean rate."""
    if gpus < 1 or nnodes < 1 or gpus % nnodes:
        raise ValueError(f"--gpus {gpus} over --nnodes {nnodes}: give a multiple of the hosts")
    shape = load_shape(model_name).quantized(quantization, kv_cache_dtype)
    workload = get_workload(workload_name)
    per_node = gpus // nnodes
    model = node_model(shape, per_node, gpu_kind, link)
    reqs, rate = workload_requests(workload, options)
    arrivals = workload_arrivals(workload, options) if trace else ()
    engine = Engine()
    chosen, refused = candidates(shape, gpus, per_node, workload.offline)
    advisor = Advisor(model, max_seqs=engine.max_num_seqs)  # Shift at the model's crossover
    chosen = [_with_threshold(advisor, c) for c in chosen]
    predictions, unfit = predict_all(model, chosen, reqs, rate, engine, arrivals=arrivals)
    refused.update(unfit)
    predictions += flying_predictions(model, predictions, reqs, rate, engine, per_node,
                                      arrivals)
    if not predictions:
        raise ValueError(f"no plan of {gpus} GPUs fits {model_name}: "
                         + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    ranked_ = ranked(predictions, workload.offline, reqs)
    notes = [f"predicted from {len(reqs)} requests of `{workload_name}` (seed {options.seed}); "
             f"profiles: {model.compute.source.split(' by ')[0]}",
             "offline: throughput from continuous batching by events; TTFT of a mean prompt on "
             "an idle node"
             if workload.offline else
             f"online from the arrival trace of {len(arrivals)} requests ({rate:.3g} req/s on "
             "average): ranked by their median latency" if arrivals else
             f"online at {rate:.3g} req/s: a queue per replica"]
    if shape.fp8_weights or shape.kv_elem_bytes == 1:
        weights = "E4M3 linear weights" if shape.fp8_weights else "weights in the model's dtype"
        kv = "E4M3" if shape.kv_elem_bytes == 1 else "the model's dtype"
        notes.append(f"FP8: {weights} (the profile's FP8 GEMM fit); KV cache in {kv}")
    if nnodes > 1:
        notes.append("across hosts only PP and DP; no inter-host link profile is committed, so "
                     "a PP stage boundary between hosts is costed at the intra-host rate")
    if model.link is not None and model.link.link != "nvlink":
        notes.append(f"link: {model.link.link} ({model.link.source.split(':')[0]})")
    if model.link is not None and model.link.ranks < per_node:
        notes.append(f"{per_node} GPUs a host: collectives scaled from the {model.link.ranks}-GPU "
                     "link profile by ring traffic (not measured at this size)")
    return Recommendation(model_name, gpus, nnodes, workload_name, ranked_, refused, notes)


FLYING_MERGE_RUNNING = 4  # FlyingConfig.merge_running's default


def flying_predictions(model: StepModel, ranked: list[Prediction], reqs: list, rate: float,
                       engine: Engine, per_node: int, arrivals: tuple = ()
                       ) -> list[Prediction]:
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
            merged = predict(model, Served(Plan(tp=width)), reqs, rate, engine,
                             arrivals=arrivals)
            in_flight = dp_pred.detail.get("decode_batch", 0) * plan.dp
            if not dp_pred.overloaded and in_flight <= FLYING_MERGE_RUNNING:
                chosen = merged
        out.append(Prediction(f"flying-{dp_pred.name}", "flying", chosen.ttft_s, chosen.tpot_s,
                              chosen.throughput, dp_pred.kv_tokens, chosen.overloaded,
                              {"runs": "merged" if chosen is merged else "split"},
                              chosen.latency_s))
    return out


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
