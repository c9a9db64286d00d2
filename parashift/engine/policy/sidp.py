"""SiDP's mode switch (arXiv 2605.28095 §4.3): the replicas that share FFN weights run
Compute-as-a-Service for small steps (their tokens go to the slices: no weight moves) and
Weight-as-a-Service for large ones (each fetches the slices it lacks into slots, hidden
under its own step), by B_th, the step size from which a fetch hides (benchmarks/
sidp_probe.py), with hysteresis and a least dwell; with the cost model, B_th is where its
WaS step stops being slower than its CaS step and each round takes the faster mode. All the
sharing replicas take one mode."""
import json
import os

from parashift.cost.advisor import advisor_for
from parashift.engine.policy.protocol import Decision, NodeView
from parashift.parallel.layout import Layout
from parashift.parallel.plan import FFN_MODES

HYSTERESIS = 0.2  # leave a mode only past B_th by this fraction
NEVER = 2**62  # B_th where the probe found no step long enough to hide the fetch


def probed_threshold(path: str, model: str, replicas: int, tp: int) -> int:
    """B_th for `model` (its shape's name: a config file's or a folder's name, any case) at
    d = `replicas` and `tp`, from the JSON of benchmarks/sidp_probe.py."""
    with open(path) as f:
        table = json.load(f)["b_th"]
    name = os.path.splitext(os.path.basename(os.path.normpath(model)))[0].lower()
    key = f"{name}|d={replicas}|tp={tp}"
    if key not in table:
        raise ValueError(f"{path} has no B_th for {key!r}; it has {sorted(table)}")
    return NEVER if table[key] is None else int(table[key])


class SidpPolicy:
    name = "sidp"

    def __init__(self, layout: Layout, threshold: int, dwell_steps: int,
                 hysteresis: float = HYSTERESIS):
        if any(plan.shared_ffn is None for plan in layout.plans):
            raise ValueError("the sidp policy needs replicas that share FFN weights "
                             f"(--share-ffn with -dp >= 2), got {layout.name()}")
        self.by_mode = {mode: [p.sharing_ffn(mode, p.shared_ffn[1]) for p in layout.plans]
                        for mode in FFN_MODES}
        self.plans = list(layout.plans) + [p for mode in FFN_MODES for p in self.by_mode[mode]
                                           if p not in layout.plans]
        self.mode = layout.plans[0].shared_ffn[0]
        self.threshold, self.dwell, self.hysteresis = threshold, dwell_steps, hysteresis
        self.since_switch = dwell_steps  # the first switch may come at once
        self.switches = 0

    def target(self, tokens_per_replica: float) -> str:
        """The mode the load asks for, with hysteresis around the threshold."""
        if self.mode == "cas" and tokens_per_replica > self.threshold * (1 + self.hysteresis):
            return "was"
        if self.mode == "was" and tokens_per_replica < self.threshold * (1 - self.hysteresis):
            return "cas"
        return self.mode

    def decide(self, view: NodeView) -> Decision:
        """One decision per scheduling round (about one per step); the dwell counts them."""
        busy = [g.next_step_tokens for g in view.groups if g.next_step_tokens > 0]
        self.since_switch += 1
        target = self.target(sum(busy) / len(busy) if busy else 0.0)
        if target != self.mode and self.since_switch >= self.dwell:
            self.mode, self.since_switch = target, 0
            self.switches += 1
        return Decision(tuple(plan.name() for plan in self.by_mode[self.mode]))


def policy_from_config(config, layout: Layout, hf_config) -> SidpPolicy:
    """With the cost model's B_th (`cost_profile`, no probe file) each round takes the mode
    predicted faster for its tokens: a switch moves no weight and drains nothing, so no
    hysteresis or dwell (they guard a threshold set by hand)."""
    replicas, tp = layout.plans[0].ffn_replicas, layout.plans[0].tp
    threshold = threshold_for(config, hf_config, replicas, tp)
    if config.sidp.probe_file is None and getattr(config, "cost_profile", None) is not None:
        return SidpPolicy(layout, threshold, dwell_steps=1, hysteresis=0.0)
    return SidpPolicy(layout, threshold, config.sidp.min_dwell_steps)


def threshold_for(config, hf_config, replicas: int, tp: int) -> int:
    """B_th: the threshold given, probed for this model and shape (sidp_probe_file), or with
    `cost_profile` the cost model's."""
    if config.sidp.probe_file is not None:
        return probed_threshold(config.sidp.probe_file, config.model or "", replicas, tp)
    advisor = advisor_for(config, hf_config, replicas * tp)
    if advisor is not None:  # where WaS is predicted no slower than CaS
        graphs = getattr(config, "cuda_graphs", None) is not False  # CaS decodes' (default)
        modelled = advisor.sidp_crossover(tp, replicas, cas_graphs=graphs)
        return NEVER if modelled is None else modelled
    return config.sidp.batch_threshold
