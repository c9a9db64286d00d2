"""The cost model's answers to the policies' questions, for one model on one node:
- Shift: up to how many tokens a step runs faster under the shift plan (TP over SP_TP)
  than under its base plan (the threshold; SP and TP share the KV, so a switch costs
  nothing and the faster plan of each step is the choice);
- SiDP: B_th, the tokens per replica from which fetching a layer's FFN slices from their
  owners (Weight-as-a-Service) hides under the step's own compute of that layer, at the
  link profile's measured peer-copy rate;
- Flying: a decode step's and a prompt's seconds under any plan, before the node has run
  that plan (what its gain-against-cost check reads where the view has no measurement).

`EngineConfig.cost_profile` names the profiles: "auto" (the committed profile of this
device kind, benchmarks/results/profiles/), or a compute profile's JSON path (its link
profile beside it, `<name>_link.json`, else the committed one of the node's width)."""
from pathlib import Path

from parashift.cost.links import committed_links
from parashift.cost.profile import ComputeProfile, LinkProfile, load
from parashift.cost.shape import SHAPES, ModelShape
from parashift.cost.sidp import sidp_step
from parashift.cost.step import StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan

PROFILES = SHAPES.parent / "results" / "profiles"
DEVICE_KINDS = {"h200": "h200"}  # a device name's word -> the committed profiles' prefix


class Advisor:
    def __init__(self, model: StepModel, context: int = 1024, max_seqs: int = 256):
        self.model, self.context, self.max_seqs = model, context, max_seqs

    # ---- steps -----------------------------------------------------------------------
    def decode_step_s(self, plan: Plan, batch: int, context: int | None = None) -> float:
        return self.model.step_s(replica_plan(plan),
                                 StepBatch.decode(max(1, batch), context or self.context))

    def tokens_step_s(self, plan: Plan, tokens: int) -> float:
        """A step of `tokens`: that many decodes up to the scheduler's seats, one prompt
        chunk beyond."""
        if tokens <= self.max_seqs:
            return self.decode_step_s(plan, tokens)
        return self.model.step_s(replica_plan(plan), StepBatch.prefill(tokens))

    def prefill_tokens_per_s(self, plan: Plan, tokens: int = 4096) -> float:
        """One replica's prompt tokens a second."""
        return tokens / self.model.step_s(replica_plan(plan), StepBatch.prefill(tokens))

    # ---- Shift ---------------------------------------------------------------------------
    def shift_threshold(self, base: Plan, most: int = 16384) -> int:
        """The largest step size (tokens) up to which the shift plan is no slower than the
        base plan, scanning powers of two then bisecting the first loss (0: never faster)."""
        shift = base.shift_plan()

        def shift_loses(tokens: int) -> bool:
            return self.tokens_step_s(shift, tokens) > self.tokens_step_s(base, tokens)
        first_loss = _fewest(shift_loses, most)
        return most if first_loss is None else first_loss - 1

    # ---- SiDP ------------------------------------------------------------------------
    def sidp_threshold(self, tp: int, replicas: int, most: int = 4096) -> int | None:
        """B_th: the fewest decodes per replica (at the advisor's context) whose step
        computes a layer for at least as long as fetching that layer's FFN slices from the
        other owners takes; None where no step up to `most` hides it."""
        link = self.model.link
        if link is None:
            raise ValueError("SiDP's B_th needs a link profile (peer copies)")
        s = self.model.shape
        fetch = link.seconds("peer_copy", s.mlp_params * s.linear_bytes / tp
                             * (replicas - 1) / replicas, 2)
        plan = Plan(tp=tp)

        def hides(batch: int) -> bool:
            return self.decode_step_s(plan, batch) / s.num_layers >= fetch
        if not hides(most):
            return None
        low, high = 0, most
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if hides(mid) else (mid, high)
        return high


    def sidp_crossover(self, tp: int, replicas: int, most: int = 16384,
                       cas_graphs: bool = True) -> int | None:
        """The fewest tokens a replica's step holds (decodes up to the scheduler's seats, a
        prompt chunk beyond) from which the predicted Weight-as-a-Service step is no slower
        than the Compute-as-a-Service one (cost/sidp.py: the exposed fetch against the
        exchanges and the d-times-taller FFN); None where CaS stays faster up to `most`.
        The CaS decodes priced in graphs, as the engine replays them by default
        (`cas_graphs` False: eagerly, --no-cuda-graphs); WaS's steps run eagerly."""
        plan = Plan(tp=tp)
        model = self.model if cas_graphs else self.model.eager()

        def batch(tokens: int) -> StepBatch:
            return (StepBatch.decode(tokens, self.context) if tokens <= self.max_seqs
                    else StepBatch.prefill(tokens))

        def was_wins(tokens: int) -> bool:
            b = batch(tokens)
            return (sidp_step(model, plan, b, replicas, "was").total
                    <= sidp_step(model, plan, b, replicas, "cas").total)
        return _fewest(was_wins, most)



def advisor_for(config, hf_config, world_size: int) -> Advisor | None:
    """The advisor `config.cost_profile` asks for (None: the policies' fixed thresholds)."""
    model = step_model_for(config, hf_config, world_size)
    return None if model is None else Advisor(model, max_seqs=config.max_num_seqs)


def step_model_for(config, hf_config, world_size: int) -> StepModel | None:
    """The step model of `config.cost_profile` for this model over `world_size` ranks (its
    quantization and KV dtype); None without a profile."""
    if getattr(config, "cost_profile", None) is None:
        return None
    compute, link = load_profiles(config.cost_profile, world_size)
    shape = ModelShape.of_config(hf_config.to_dict() if hasattr(hf_config, "to_dict")
                                 else dict(vars(hf_config)), "model")
    if not shape.moe:  # the engine refuses FP8 experts before this is asked
        fp8 = getattr(config, "quantization", None) == "fp8"
        shape = shape.quantized("fp8" if fp8 else None, getattr(config, "kv_cache_dtype", "auto"))
    return StepModel(shape, compute, link,
                     deterministic=bool(getattr(config, "deterministic", False)))


def load_profiles(spec: str, world_size: int) -> tuple[ComputeProfile, LinkProfile | None]:
    if spec == "auto":
        spec = str(PROFILES / f"{_device_kind()}_compute.json")
    path = Path(spec)
    compute = load(path)
    if not isinstance(compute, ComputeProfile):
        raise ValueError(f"cost_profile {spec}: not a compute profile")
    if world_size < 2:
        return compute, None
    prefix = path.stem.removesuffix("_compute")
    named = [path.with_name(f"{prefix}_link.json")]
    found = {p for folder in (path.parent, PROFILES)
             for p in committed_links(folder, prefix).values()}
    links = [load(p) for p in named + sorted(found) if p.exists()]
    if not links:
        raise ValueError(f"no link profile of {prefix} beside {spec} or in {PROFILES}: measure "
                         "one with `parashift profile` on the node's GPUs")
    wide_enough = [link for link in links if link.ranks >= world_size]
    return compute, (min(wide_enough, key=lambda link: link.ranks) if wide_enough
                     else max(links, key=lambda link: link.ranks))


def _device_kind() -> str:
    import torch
    name = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() else "cpu"
    for word, prefix in DEVICE_KINDS.items():
        if word in name:
            return prefix
    raise ValueError(f"cost_profile='auto': no committed profile for {name!r} (known: "
                     f"{', '.join(DEVICE_KINDS)}); measure one with `parashift profile "
                     "--output FILE` and give its path")


def _fewest(holds, most: int) -> int | None:
    """The fewest n in [1, most] where `holds(n)` (false below it, true from it on), scanning
    powers of two then bisecting; None where it does not hold at any power up to `most`."""
    if holds(1):
        return 1
    low, high = 1, 2
    while high <= most and not holds(high):
        low, high = high, high * 2
    if high > most:
        return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high
