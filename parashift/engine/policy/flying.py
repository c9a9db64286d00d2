"""Flying Serving (arXiv 2602.22593): data-parallel replicas serve heavy load, and merge
into tensor-parallel groups when the load is light (one request then runs on every GPU's
bandwidth); a queue splits them again.

The policy picks a width (how many replicas one group merges) and moves the node, its
merges at once, a split at a time, to that width's layout: every aligned group of that many
consecutive replicas merged, the replicas after the last whole group serving as they are
(`widths.py`). What it picks, first rule first:
- a request more urgent than the default (priority < 0, vLLM's order: lower is more
  urgent) binds the widest group at once, while replicas outside it keep serving (unless
  that group's plan was measured to decode no faster, `cost.py`);
- a request that no group of a narrower width holds (prompt + max_tokens against
  `NodeView.max_context`) keeps the node at a width that holds it (the paper's use case 3);
- otherwise the load: with the cost model (`cost_profile`), the width whose layout is
  predicted to finish the requests in hand soonest (`SwitchCosts.fastest_width`); without
  it, the widest width at or below `merge_running` running requests and an empty queue,
  width 1 once requests wait and running and waiting ones together pass `merge_running`,
  or running ones pass twice that (hysteresis), and otherwise the width it has.
The first two act at once. A merge the load asks for waits `dwell_s` after the previous
change; a split for load does not (every request a merged group admits meanwhile runs in
it until it ends, between the replicas' steps once they split). Either happens only when its
gain exceeds its cost (`cost.py`; with the cost model the gain is the predicted time the
new layout saves on the work in hand, `SwitchCosts.switch_pays`).

Told the workload with the cost model (`flying_request_rate`, `flying_workload_file`, ...),
it merges no wider than the width whose layout the model predicts serves that workload best
(an arrival trace's bursts included: cost/forecast_trace.py).

The merges a width needs happen together, as one transition (a node of 8 replicas moving
to width 2 makes its 4 pairs at once: none prefills alone for the work to be recomputed).
The starting layout must be w plain replicas of one TP degree on consecutive ranks; the
merged plans of every aligned width the model's heads allow are made at start-up (so
their communicators are pre-built)."""
import logging
from dataclasses import replace

from parashift.cost.advisor import advisor_for
from parashift.cost.plan_choice import best_of
from parashift.cost.runs import Engine
from parashift.cost.workload_hint import hint_of
from parashift.designs.options import hinted
from parashift.engine.policy.cost import SwitchCosts
from parashift.engine.policy.protocol import Decision, NodeView
from parashift.engine.policy.widths import layouts_by_width, transition_towards
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan
from parashift.parallel.topology import Topology

logger = logging.getLogger(__name__)


def merged_plans(replicas: list[Plan], num_heads: int, num_kv_heads: int,
                 topology: Topology | None = None) -> list[Plan]:
    """Every merge of `width` aligned consecutive replicas the model's heads divide, at
    widths whose merges all stay inside a host (a merged plan is one TP group)."""
    plans = []
    for width in range(2, len(replicas) + 1):
        candidates = [Plan.merged(replicas[i:i + width])
                      for i in range(0, len(replicas) - width + 1, width)]
        if topology is not None and any(topology.cross_host_groups(p) for p in candidates):
            continue
        try:
            candidates[0].check_model(num_heads, num_kv_heads, num_layers=1)
        except ValueError:
            continue
        plans += candidates
    return plans


class FlyingPolicy:
    name = "flying"
    reads_requests = True  # the view's needs, decode left and recompute tokens
    acts_when_idle = True  # an idle node merges before the next request, not in its TTFT

    def __init__(self, layout: Layout, num_heads: int, num_kv_heads: int,
                 merge_running: int = 4, dwell_s: float = 2.0,
                 costs: SwitchCosts = SwitchCosts(), preemption: str = "auto",
                 topology: Topology | None = None):
        replicas = list(layout.plans)
        t = replicas[0].tp
        aligned = all(plan == Plan(tp=t).on(tuple(range(i * t, (i + 1) * t)))
                      for i, plan in enumerate(replicas))
        if len(replicas) < 2 or not aligned:
            raise ValueError("the flying policy needs two or more data-parallel replicas of one "
                             f"TP degree (e.g. -dp 2), got layout {layout.name()}")
        if merge_running < 0 or dwell_s < 0:
            raise ValueError("flying policy: merge_running and dwell_s must be >= 0")
        self.replicas = replicas
        self.merges = merged_plans(replicas, num_heads, num_kv_heads, topology)
        if not self.merges:
            raise ValueError(f"the model's {num_heads} heads and {num_kv_heads} KV heads do not "
                             f"split over any merge of {len(replicas)} replicas inside a host")
        self.plans = replicas + self.merges
        self.layouts = layouts_by_width(replicas, {plan.name() for plan in self.plans})
        self.widest = max(self.layouts)
        self.merge_running, self.dwell_s, self.costs = merge_running, dwell_s, costs
        self.preemption = preemption  # the engine's --flying-preemption
        self.width = 1  # the width it moves the node to
        self._last_change = float("-inf")
        self._bound = False  # the last change bound a priority request

    def decide(self, view: NodeView) -> Decision:
        self.width = self._choose_width(view)
        transition = transition_towards(view.layout, self.layouts[self.width], at_once=True)
        if transition is None:
            return Decision(view.layout)
        factor = len(transition.target) if transition.kind == "split" else 1
        return Decision(view.layout, (replace(transition, preemption=self._preempts(
            transition.kind, view, factor)),))

    def _preempts(self, kind: str, view: NodeView, factor: float) -> str:
        """What a merge or split does with the running requests of its groups, under auto:
        a merge for a priority request pauses them (hard preemption: they resume, KV kept,
        once it is served), a merge for load moves them into the faster group (computed
        again, as the paper's soft preemption does). A split into `factor` groups keeps them
        where their KV was written (they finish in merged steps between the new replicas'
        steps, on every rank), unless computing them again in the new groups costs less
        than those extra steps."""
        if self.preemption != "auto":
            return self.preemption
        if kind == "merge":
            return "hard" if self._bound else "recompute"
        return "soft" if self.costs.keeping_pays(view, factor) else "recompute"

    def _choose_width(self, view: NodeView) -> int:
        floor = self._narrowest_holding(view)
        urgent = any(g.priorities and g.priorities[0] < 0 for g in view.groups)
        self._bound = urgent and self.costs.speedup(
            view, self.widest, self.layouts[self.widest]) > 1  # against a replica
        if self._bound:
            return self._change(self.widest, view.time)
        if self.width < floor:
            return self._change(floor, view.time)
        wanted = max(self._width_for_load(view), floor)
        if wanted == self.width or (wanted > self.width
                                    and view.time - self._last_change < self.dwell_s):
            return self.width
        return self._change(wanted, view.time) if self._pays(view, wanted) else self.width

    def _narrowest_holding(self, view: NodeView) -> int:
        """The narrowest width whose groups hold every request of the node."""
        need = max([view.unplaced_need, *(g.longest_need for g in view.groups)])
        if not view.max_context or need == 0:
            return 1
        holding = [w for w, tokens in view.max_context if tokens >= need and w in self.layouts]
        return min(holding, default=self.widest)

    def _width_for_load(self, view: NodeView) -> int:
        """A queue splits only when the requests outnumber what a merge serves: the
        requests a merge moves wait in the merged group until its next step admits them,
        and splitting for those would undo every merge (a livelock under recompute)."""
        if self.costs.advisor is not None:
            return self.costs.fastest_width(view, self.layouts, self.width)
        waiting = sum(g.num_waiting for g in view.groups)
        running = sum(g.num_running for g in view.groups)
        if waiting == 0 and running <= self.merge_running:
            return self.widest
        if (waiting > 0 and running + waiting > self.merge_running
                or running > 2 * self.merge_running):
            return 1
        return self.width

    def _pays(self, view: NodeView, wanted: int) -> bool:
        if self.costs.advisor is not None:
            kind = "merge" if wanted > self.width else "split"
            factor = max(wanted, self.width) / min(wanted, self.width)
            moves = self._preempts(kind, view, factor) == "recompute"
            return self.costs.switch_pays(view, self.layouts[wanted], moves)
        if wanted > self.width:
            return self.costs.merge_pays(view, wanted / self.width,
                                         self._preempts("merge", view, 1) == "recompute",
                                         self.layouts[wanted])
        overfull = sum(g.num_running for g in view.groups) > 2 * self.merge_running
        factor = self.width / wanted
        return self.costs.split_pays(view, factor, overfull,
                                     self._preempts("split", view, factor) == "recompute",
                                     self.layouts[wanted])

    def _change(self, width: int, now: float) -> int:
        if width != self.width:
            self._last_change = now
        return width


def policy_from_config(config, layout: Layout, hf_config) -> FlyingPolicy:
    """With `cost_profile`, what a merge or split gains and costs is predicted where the
    node has not measured it (cost.py); told the workload (`flying_request_rate`,
    `flying_workload_file`, ...), the policy merges no wider than the width whose layout
    the model predicts serves it best."""
    advisor = advisor_for(config, hf_config, layout.world_size)
    policy = FlyingPolicy(layout, hf_config.num_attention_heads, hf_config.num_key_value_heads,
                          config.flying.merge_running, config.flying.dwell_s,
                          costs=SwitchCosts(advisor=advisor),
                          preemption=config.flying.preemption,
                          topology=getattr(config, "topology", None))
    if advisor is None or not hinted(config.flying):
        return policy
    width = told_width(policy, advisor.model, hint_of(config.flying), config)
    logger.info("flying: merges no wider than %d replicas (the cost model's best layout for "
                "the workload told)", width)
    policy.layouts = {w: names for w, names in policy.layouts.items() if w <= width}
    policy.widest = width
    return policy


def told_width(policy: FlyingPolicy, model, hint, config) -> int:
    """The width whose layout (its replicas merged in groups of that width) is predicted to
    serve the workload best, among the widths that divide the node."""
    replicas, tp = len(policy.replicas), policy.replicas[0].tp
    plans = {w: Plan(dp=replicas // w, tp=w * tp) for w in policy.layouts if replicas % w == 0}
    best = best_of(model, list(plans.values()), hint, replicas * tp,
                   Engine(config.max_num_seqs, config.max_num_batched_tokens or 8192))
    return next(w for w, plan in plans.items() if plan.name() == best.name)
