"""Flying Serving (arXiv 2602.22593): data-parallel replicas serve heavy load, and merge
into one tensor-parallel group when the load is light (one request then runs on every
GPU's bandwidth); a queue splits them again. This is its first form: the replicas merge
into the widest aligned group and split back, with hysteresis (merge at or below
`merge_running` running requests and an empty queue; split once a request waits or
running requests pass twice that) and a minimum dwell between transitions.

The starting layout must be w plain replicas of one TP degree on consecutive ranks; the
merged plans of every aligned width the model's heads allow are made at start-up (so
their communicators are pre-built), the widest (from replica 0) is the one this policy
merges into; replicas it does not cover keep serving as they are."""
from parashift.engine.policy.protocol import Decision, NodeView, Transition
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan


def merged_plans(replicas: list[Plan], num_heads: int, num_kv_heads: int) -> list[Plan]:
    """Every merge of `width` aligned consecutive replicas the model's heads divide."""
    plans = []
    for width in range(2, len(replicas) + 1):
        candidates = [Plan.merged(replicas[i:i + width])
                      for i in range(0, len(replicas) - width + 1, width)]
        try:
            candidates[0].check_model(num_heads, num_kv_heads, num_layers=1)
        except ValueError:
            continue
        plans += candidates
    return plans


class FlyingPolicy:
    name = "flying"

    def __init__(self, layout: Layout, num_heads: int, num_kv_heads: int,
                 merge_running: int = 4, dwell_s: float = 2.0):
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
        self.merges = merged_plans(replicas, num_heads, num_kv_heads)
        if not self.merges:
            raise ValueError(f"the model's {num_heads} heads and {num_kv_heads} KV heads do not "
                             f"split over any merge of {len(replicas)} replicas")
        self.widest = max(self.merges, key=lambda plan: plan.tp)  # the first of its width
        width = self.widest.merge_base[0]
        self.split_layout = tuple(plan.name() for plan in replicas)
        self.merged_layout = (self.widest.name(), *self.split_layout[width:])
        self.plans = replicas + self.merges
        self.merge_running, self.dwell_s = merge_running, dwell_s
        self._last_change = float("-inf")

    def decide(self, view: NodeView) -> Decision:
        current = Decision(view.layout)
        if view.time - self._last_change < self.dwell_s:
            return current
        waiting = sum(g.num_waiting for g in view.groups)
        running = sum(g.num_running for g in view.groups)
        width = self.widest.merge_base[0]
        if view.layout == self.split_layout and waiting == 0 and running <= self.merge_running:
            transition = Transition("merge", tuple(range(width)), (self.widest.name(),))
        elif view.layout == self.merged_layout and (
                waiting > 0 or running > 2 * self.merge_running):
            transition = Transition("split", (0,), self.split_layout[:width])
        else:
            return current
        self._last_change = view.time
        return Decision(view.layout, (transition,))
