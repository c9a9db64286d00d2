"""SiDP's step (arXiv 2605.28095; worker/shared_ffn.py): d DP replicas of TP = t whose ranks
each hold one 1/d slice of every FFN layer of their TP shard.

- Weight-as-a-Service (`was`): before a layer's FFN a rank copies the d - 1 slices it lacks
  from its peers into a slot, during the layers before it: a layer takes the longer of its
  own compute and its fetch (the fetch is exposed where the step is short).
- Compute-as-a-Service (`cas`): the replicas' tokens are gathered on every rank, each
  applies its slice (1/d of the FFN width) to all of them, and the sums are reduce-scattered
  back: the FFN runs d times the rows at 1/d of the width, plus the two exchanges, a layer.

The mode of a step: `was` from B_th tokens a replica (the sidp policy's rule, its
hysteresis left out), else `cas`."""
from parashift.cost.step import Breakdown, StepBatch, StepModel, replica_plan
from parashift.cost.switch import sidp_fetch_s
from parashift.parallel.plan import Plan

SLOTS = 2  # SidpConfig.slots' default: layers' worth of fetched slices a rank holds


def sidp_mode(tokens: int, threshold: int | None) -> str:
    return "was" if threshold is not None and tokens >= threshold else "cas"


def sidp_step(model: StepModel, plan: Plan, batch: StepBatch, owners: int, mode: str
              ) -> Breakdown:
    """One replica's step of `plan` (plain TP) whose FFN weights `owners` replicas share."""
    if model.link is None:
        raise ValueError("SiDP's steps need a link profile (peer copies, exchanges)")
    if model.shape.moe or model.shape.fp8_weights:
        raise ValueError("SiDP shares dense FFN weights in the model's dtype (the engine "
                         "refuses MoE experts and FP8 weights)")
    s = model.shape
    # WaS's fetches are not captured: its steps run eagerly (worker/shared_ffn.py)
    out = (model.eager() if mode == "was" else model).step(replica_plan(plan), batch)
    if mode == "was":
        device = sum(v for k, v in out.parts.items() if not k.startswith("host"))
        extra = s.num_layers * max(0.0, sidp_fetch_s(model, plan.tp, owners)
                                   - device / s.num_layers)
        name = "ffn_fetch_exposed"
    elif mode == "cas":
        graph = model.graphs and batch.is_decode
        exchange = 2 * model.link.seconds("all_gather", batch.tokens * s.hidden * s.dtype_bytes,
                                          owners, graph)
        shared = model.mlp_s(batch.tokens * owners, plan.tp * owners)
        extra = s.num_layers * (shared + exchange - model.mlp_s(batch.tokens, plan.tp))
        name = "ffn_cas"
        if not graph:  # the exchanges' launches and the hooks' packing, from the host
            return _eager_cas(model, plan, batch, out, extra, owners)
    else:
        raise ValueError(f"a SiDP mode is was or cas, got {mode!r}")
    out.add(name, extra)
    out.total += extra
    return out


def idle_cas_step(model: StepModel) -> Breakdown:
    """A CaS round's replica with no tokens (worker/shared_ffn.py `serve_idle`): its FFN
    blocks still gather the peers' rows, apply its slices and scatter the sums back, eagerly
    (no graph holds an empty step), each layer's exchanges launched from its host
    (`cas_kernels_per_peer`, the eager CaS fit's launches for one peer), while the busy
    replicas wait on them at every layer; their FFN work it adds is in the busy steps."""
    c = model.compute
    host = model.shape.num_layers * c.cas_kernels_per_peer * c.eager_launch_s
    return Breakdown({"idle_cas_host": host}, host)


def _eager_cas(model: StepModel, plan: Plan, batch: StepBatch, out: Breakdown,
               extra: float, owners: int) -> Breakdown:
    """An eager CaS step: its device time with the exchanges against its host's launches
    with the exchanges' (`cas_kernels_per_peer` more a layer for each sharing replica); the peers wait on each
    other's launches at every layer, so the longer of the two is the step."""
    c = model.compute
    device = sum(v for k, v in out.parts.items() if not k.startswith("host")) + extra
    host = (model.host_s(replica_plan(plan), batch, False)
            + model.shape.num_layers * c.cas_kernels_per_peer * owners * c.eager_launch_s)
    out.parts.pop("host_launch_excess", None)
    out.add("ffn_cas", extra)
    out.parts["host_launch_excess"] = max(0.0, host - device)
    out.total = max(device, host)
    return out
