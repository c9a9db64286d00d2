"""Flying Serving's cost check: a merge or split that the load asks for happens only when
its expected gain exceeds its cost, both in seconds and both read off the node view.

Cost: the drain (the step in flight of a group with running requests finishes first: one
step) plus the tokens its requests compute again in their new groups
(`GroupView.recompute_tokens`; zero where requests keep their KV across the switch), at the
prompt rate the groups' plans measured (`prefill_rate`).
Gain of a merge by `factor` (k groups into one): the running requests' remaining decode
steps run `speedup` times as fast: the merged plan's measured decode step against the
groups' once both have run one (`NodeView.decode_step_s`), else k times at `efficiency`
(light load: decode is bound by memory bandwidth, which a merge adds up). A merge whose
measured speedup is not above 1 never pays, not even on an idle node.
Gain of a split: the queued prompt tokens are computed by k groups instead of one, each
waiting request gets a seat a step sooner, and a batch grown past the merge threshold stops
paying the merged group's communication. With the cost model (`advisor`) the share of k
times a replica's pace a merged group keeps (`efficiency`) is predicted for the plans at
hand (`merged_efficiency`) instead of the fixed default. A split keeps its running requests in their merged
plan only while their remaining steps cost less than computing them again
(`keeping_pays`).
With the cost model the policy's load rule and check are the model's own: the width whose
layout finishes the requests in hand soonest (`fastest_width`, `work_s`), and a switch only
where that saving covers the drain and the moved requests' recompute (`switch_pays`)."""
from dataclasses import dataclass, field

from parashift.engine.policy.protocol import NodeView
from parashift.parallel.plan import Plan


@dataclass(frozen=True)
class SwitchCosts:
    prefill_tokens_per_s: float = 8192.0  # one replica's prompt throughput, until measured
    efficiency: float = 0.8   # a k-wide merged group steps k * efficiency times as fast
    step_s: float = 0.02      # a decode step, until the view has measured one
    # the cost model (cost/advisor.py): where set, what the view has not measured is
    # predicted from the profiles instead of the three defaults above
    advisor: object = field(default=None, compare=False)
    # widths whose predicted work is within this share of the fastest's are tied: the
    # model's step times miss by a few percent (docs/results.md), so a nearer win is noise
    tie_margin: float = 0.02

    def __post_init__(self):
        if not (self.prefill_tokens_per_s > 0 and 0 < self.efficiency <= 1 and self.step_s > 0
                and 0 <= self.tie_margin < 1):
            raise ValueError("switch costs: prefill_tokens_per_s and step_s must be > 0, "
                             f"efficiency in (0, 1], tie_margin in [0, 1), got {self}")

    def step_seconds(self, view: NodeView) -> float:
        measured = [g.step_s for g in view.groups if g.step_s > 0]
        if measured:
            return max(measured)
        if self.advisor is not None and view.layout:
            return max(self.advisor.decode_step_s(Plan.parse(name), _running(view))
                       for name in view.layout)
        return self.step_s

    def prefill_rate(self, view: NodeView) -> float:
        """One replica's prompt tokens a second: the slowest group's measured rate per rank
        (a merged group's rate is its ranks' together), or predicted, or the default."""
        measured = [g.prefill_tokens_per_s for g in view.groups if g.prefill_tokens_per_s > 0]
        if measured:
            return min(measured)
        if self.advisor is not None and view.layout:
            return min(self.advisor.prefill_tokens_per_s(Plan.parse(name)) / Plan.parse(
                name).world_size for name in view.layout)
        return self.prefill_tokens_per_s

    def cost(self, view: NodeView, factor: float, moves_running: bool = True) -> float:
        """Seconds a switch costs: drain, and, where it moves the running requests, their
        recompute spread over `factor` replicas' worth of ranks."""
        drain = self.step_seconds(view) if any(g.num_running for g in view.groups) else 0.0
        recompute = sum(g.recompute_tokens for g in view.groups) if moves_running else 0
        return drain + recompute / (self.prefill_rate(view) * factor)

    def speedup(self, view: NodeView, factor: float, merged: tuple[str, ...] = ()) -> float:
        """How many times faster a decode step of the `merged` plans runs than one of the
        layout's other plans: measured where both sides ran one (the slowest plan of each),
        else `factor * efficiency`."""
        measured = dict(view.decode_step_s)
        merged_s = [measured[p] for p in merged if measured.get(p, 0) > 0]
        group_s = [measured[p] for p in view.layout
                   if p not in merged and measured.get(p, 0) > 0]
        if merged_s and group_s:
            return max(group_s) / max(merged_s)
        if self.advisor is not None and merged:
            return self._predicted_speedup(view, merged)
        return factor * self.efficiency

    def _predicted_speedup(self, view: NodeView, merged: tuple[str, ...]) -> float:
        """The layout's slowest decode step of the running requests against the merged
        plans' (each of those runs all of them, the replicas their share)."""
        running = _running(view)
        others = [n for n in view.layout if n not in merged] or list(view.layout)
        group_s = max(self.advisor.decode_step_s(Plan.parse(n), -(-running // len(others)))
                      for n in others)
        merged_s = max(self.advisor.decode_step_s(Plan.parse(n), running) for n in merged)
        return group_s / merged_s

    def merge_gain(self, view: NodeView, factor: float, moves_running: bool = True,
                   merged: tuple[str, ...] = ()) -> float:
        """The running requests' decode time saved, where the merge moves them (requests
        that keep their KV where it was written keep their speed)."""
        if not moves_running:
            return 0.0
        steps = max((g.longest_decode_left for g in view.groups), default=0)
        return steps * self.step_seconds(view) * (1 - 1 / self.speedup(view, factor, merged))

    def merged_efficiency(self, view: NodeView, factor: float, merged: tuple[str, ...] = (),
                          replicas: tuple[str, ...] = ()) -> float:
        """The share of `factor` times a replica's pace a merged group keeps: with the cost
        model, the `replicas`' predicted decode step of their share of the running requests
        against the `merged` plans' step of all of them, over `factor`; else `efficiency`."""
        if self.advisor is None or not merged or not replicas:
            return self.efficiency
        running = _running(view)
        group_s = max(self.advisor.decode_step_s(Plan.parse(n), -(-running // len(replicas)))
                      for n in replicas)
        merged_s = max(self.advisor.decode_step_s(Plan.parse(n), running) for n in merged)
        return min(1.0, group_s / merged_s / factor)

    def split_gain(self, view: NodeView, factor: float, overfull: bool,
                   target: tuple[str, ...] = ()) -> float:
        step = self.step_seconds(view)
        waiting = sum(g.num_waiting for g in view.groups)
        queued = sum(g.tokens_waiting for g in view.groups) / self.prefill_rate(view)
        gain = queued * (1 - 1 / factor) + waiting * step
        if overfull:
            steps = max((g.longest_decode_left for g in view.groups), default=0)
            kept = self.merged_efficiency(view, factor, tuple(view.layout), target)
            gain += steps * step * (1 - kept)
        return gain

    def keeping_pays(self, view: NodeView, factor: float) -> bool:
        """Whether a split should keep its running requests where their KV was written: kept,
        they take one merged step between the new replicas' steps on every rank until the
        longest ends; moved, their tokens are computed again by `factor` groups."""
        steps = max((g.longest_decode_left for g in view.groups), default=0)
        recompute = sum(g.recompute_tokens for g in view.groups)
        return steps * self.step_seconds(view) <= recompute / (self.prefill_rate(view) * factor)

    def merge_pays(self, view: NodeView, factor: float, moves_running: bool = True,
                   merged: tuple[str, ...] = ()) -> bool:
        replicas = tuple(n for n in view.layout if n not in merged)
        kept = self.merged_efficiency(view, factor, merged, replicas)
        return self.speedup(view, factor, merged) > 1 and self.merge_gain(
            view, factor, moves_running, merged) >= self.cost(view, factor * kept, moves_running)

    def fastest_width(self, view: NodeView, layouts: dict[int, tuple[str, ...]],
                      current: int | None = None) -> int:
        """With the cost model: the width whose layout is predicted to finish the work in
        hand soonest (`work_s`); among widths within `tie_margin` of that the `current` one
        (a switch for less is the model's noise), else the widest (an idle node's: all)."""
        work = {width: self.work_s(view, layout) for width, layout in layouts.items()}
        fastest = min(work.values())
        tied = [width for width, seconds in work.items()
                if seconds <= fastest * (1 + self.tie_margin)]
        return current if current in tied and fastest > 0 else max(tied)

    def work_s(self, view: NodeView, layout: tuple[str, ...]) -> float:
        """Predicted seconds `layout` takes for the node's requests in hand: the queued
        prompt tokens at its groups' prompt rates together, then the longest decode left
        (a waiting request's: its max_tokens) in steps of those requests spread
        evenly over its groups, a round of steps per `max_seqs` seats a group."""
        plans = [Plan.parse(name) for name in layout]
        prompts = sum(g.tokens_waiting for g in view.groups)
        prefill = prompts / sum(self.advisor.prefill_tokens_per_s(p) for p in plans)
        in_hand = sum(g.num_running + g.num_waiting for g in view.groups)
        if in_hand == 0:
            return prefill
        steps = max(max(g.longest_decode_left, _waiting_decode(g)) for g in view.groups)
        seats = self.advisor.max_seqs
        share = -(-in_hand // len(plans))
        rounds = -(-share // seats)
        step = max(self.advisor.decode_step_s(p, min(share, seats)) for p in plans)
        return prefill + rounds * steps * step

    def switch_pays(self, view: NodeView, target: tuple[str, ...], moves_running: bool) -> bool:
        """With the cost model: whether moving the node to `target` saves at least what it
        costs, both predicted for the work in hand (`work_s` under each layout; the drain,
        and the moved requests' tokens computed again at the target's prompt rate)."""
        gain = self.work_s(view, view.layout) - self.work_s(view, target)
        drain = self.step_seconds(view) if any(g.num_running for g in view.groups) else 0.0
        moved = sum(g.recompute_tokens for g in view.groups) if moves_running else 0
        rate = sum(self.advisor.prefill_tokens_per_s(Plan.parse(name)) for name in target)
        return gain >= drain + moved / rate

    def split_pays(self, view: NodeView, factor: float, overfull: bool,
                   moves_running: bool = False, target: tuple[str, ...] = ()) -> bool:
        return self.split_gain(view, factor, overfull, target) >= self.cost(
            view, factor, moves_running)


def _waiting_decode(group) -> int:
    """The most tokens a waiting request may generate: its max_tokens where the view
    carries it, else its need less the mean queued prompt (a recorded view's estimate)."""
    if group.waiting_decode_most or not group.num_waiting:
        return group.waiting_decode_most
    return group.longest_need - group.tokens_waiting // group.num_waiting


def _running(view: NodeView) -> int:
    return max(1, sum(g.num_running for g in view.groups))
