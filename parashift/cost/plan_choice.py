"""A design's start-up choice that never loses to a static plan picked by hand: the design's
candidates and every static plan of the same ranks, predicted by the one cost model
(cost/forecast.py over cost/step.py) on the workload the user describes, best first. The
design runs only where the model puts it ahead of the best static plan (by `margin`, the
share it must win by); else the engine runs that static plan under the static policy."""
from dataclasses import dataclass

from parashift.cost.forecast import Candidate, Prediction, predict_all, ranked
from parashift.cost.runs import Engine, Served
from parashift.cost.shape import ModelShape
from parashift.cost.step import StepModel
from parashift.cost.workload_hint import WorkloadHint
from parashift.parallel.plan import Plan

@dataclass(frozen=True)
class PlanChoice:
    best: Prediction
    static: bool                      # the best is a static plan (the static policy runs it)
    table: tuple[Prediction, ...]     # every candidate that fits, best first
    refused: dict[str, str]

    def report(self) -> str:
        lines = [f"{p.name:>24}  TTFT {p.ttft_s * 1e3:9.1f} ms  TPOT {p.tpot_s * 1e3:7.3f} ms  "
                 f"{p.throughput:10,.0f} tok/s{'  overloaded' if p.overloaded else ''}"
                 for p in self.table]
        return "\n".join(lines + [f"{n:>24}  refused: {why}" for n, why in self.refused.items()])


def static_plans(gpus: int, gpus_per_node: int) -> list[Plan]:
    """Every dp x pp x sp x tp plan of the GPUs whose SP x TP group stays inside a host."""
    return [Plan(dp=dp, pp=pp, sp=sp, tp=tp) for dp, pp, sp, tp in _factorizations(gpus, 4)
            if sp * tp <= gpus_per_node]


def fitting_plans(shape: ModelShape, gpus: int, gpus_per_node: int
                  ) -> tuple[list[Plan], dict[str, str]]:
    """The static plans the model's heads, layers and MLP allow; the others with why not."""
    chosen, refused = [], {}
    for plan in static_plans(gpus, gpus_per_node):
        try:
            plan.check_model(shape.num_heads, shape.num_kv_heads, shape.num_layers,
                             shape.intermediate or None)
        except ValueError as e:
            refused[plan.name()] = str(e)
            continue
        chosen.append(plan)
    return chosen, refused


def static_candidates(model: StepModel, world_size: int) -> tuple[list[Served], dict[str, str]]:
    """Every static plan of one host's ranks that the model allows, served as it is."""
    plans, refused = fitting_plans(model.shape, world_size, world_size)
    return [Served(plan) for plan in plans], refused


def choose(model: StepModel, design: list[Candidate], hint: WorkloadHint, world_size: int,
           engine: Engine, margin: float = 0.0, tier_bytes: float | None = None) -> PlanChoice:
    """The best of `design`'s candidates where it beats the best static plan by `margin`,
    else that static plan."""
    statics, refused = static_candidates(model, world_size)
    reqs, rate = hint.requests(world_size, engine)
    extra = {} if tier_bytes is None else {"tier_bytes": tier_bytes}
    arrivals = () if hint.offline else hint.arrivals
    predictions, unfit = predict_all(model, statics + design, reqs, rate, engine, **extra,
                                     arrivals=arrivals)
    refused.update(unfit)
    static_names = {s.name for s in statics}
    table = ranked(predictions, hint.offline, reqs)
    best_static = next((p for p in table if p.name in static_names), None)
    if best_static is None:
        raise ValueError(f"no plan of {world_size} ranks fits this model: "
                         + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    best_design = next((p for p in table if p.name not in static_names), None)
    wins = best_design is not None and _beats(best_design, best_static, hint, margin)
    best = best_design if wins else best_static
    return PlanChoice(best, not wins, tuple(table), refused)


def best_of(model: StepModel, plans: list[Plan], hint: WorkloadHint, world_size: int,
            engine: Engine) -> Prediction:
    """The best of `plans`, each served as it is, on the workload told."""
    reqs, rate = hint.requests(world_size, engine)
    predictions, refused = predict_all(model, [Served(p) for p in plans], reqs, rate, engine,
                                       arrivals=() if hint.offline else hint.arrivals)
    if not predictions:
        raise ValueError("no plan fits this model: " + "; ".join(
            f"{k}: {v}" for k, v in refused.items()))
    return ranked(predictions, hint.offline, reqs)[0]


def _beats(design: Prediction, static: Prediction, hint: WorkloadHint, margin: float) -> bool:
    if hint.offline:
        return design.throughput * (1 - margin) > static.throughput
    mean_out = hint.output_tokens
    return design.score(False, mean_out) < (1 - margin) * static.score(False, mean_out)


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in _factorizations(n // d, parts - 1)]
