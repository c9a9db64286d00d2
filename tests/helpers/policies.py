"""Policies for tests: scripted transitions on top of fixed plans."""
from parashift.engine.policy import Decision, NodeView, Transition
from parashift.engine.policy.widths import transition_towards
from parashift.parallel.layout import Layout


class TransitionScript:
    """Every `every`-th decision asks for a transition of `group` to the next of `targets`
    (plan names, in turn); each group's steps run under the plan it last moved to."""
    name = "transition-script"

    def __init__(self, engine, group: int, targets: list[str], every: int, kind: str):
        self.plans = engine.policy_plans
        self.current = [plan.name() for plan in engine.layout.plans]
        self.group, self.targets, self.every, self.kind = group, targets, every, kind
        self.calls = self.asked = 0

    def decide(self, view: NodeView) -> Decision:
        self.calls += 1
        plans = tuple(self.current)
        if self.calls % self.every:
            return Decision(plans)
        target = self.targets[self.asked % len(self.targets)]
        self.asked += 1
        self.current[self.group] = target
        return Decision(plans, (Transition(self.kind, (self.group,), (target,)),))


def transition_between(current: tuple[str, ...], target: Layout,
                       at_once: bool = False) -> Transition | None:
    """One merge or split (`at_once`: every merge) that moves the layout named `current`
    towards `target`."""
    return transition_towards(current, tuple(plan.name() for plan in target.plans), at_once)


class LayoutCycle:
    """Every `every`-th decision moves the layout one merge or split towards the next of
    `layouts` (in turn), `limit` times in all; steps run under each group's layout plan.
    (Requests computed again after each merge or split need steps to catch up: a cycle
    faster than that would never finish them.) An ask counts once the layout has changed
    since the one before: while a transition waits for its groups to drain, the node takes
    no other and the policy asks again (a replica outside them keeps deciding meanwhile)."""
    name = "layout-cycle"

    def __init__(self, engine, layouts: list[Layout], every: int, limit: int,
                 at_once: bool = False):
        self.plans = engine.policy_plans
        self.layouts, self.every, self.limit, self.at_once = layouts, every, limit, at_once
        self.calls = self.reached = self.asked = 0
        self.asked_in: tuple[str, ...] | None = None  # the layout of the last counted ask

    def decide(self, view: NodeView) -> Decision:
        self.calls += 1
        if self.calls % self.every or self.asked >= self.limit:
            return Decision(view.layout)
        if view.layout != self.asked_in:
            self.asked += 1
            self.asked_in = view.layout
        target = self.layouts[self.reached % len(self.layouts)]
        transition = transition_between(view.layout, target, self.at_once)
        if transition is None:  # reached: on to the next one
            self.reached += 1
            transition = transition_between(view.layout,
                                            self.layouts[self.reached % len(self.layouts)],
                                            self.at_once)
        return Decision(view.layout, (transition,) if transition else ())


class FfnModeSchedule:
    """The replicas that share FFN weights (SiDP) switch mode by a schedule: decision i
    runs every group in `mode_at(i)` ("was" or "cas")."""
    name = "ffn-mode-schedule"

    def __init__(self, engine, mode_at):
        self.plans = engine.policy_plans
        self.base = list(engine.layout.plans)
        self.mode_at, self.calls = mode_at, 0
        self.modes: list[str] = []

    def decide(self, view: NodeView) -> Decision:
        mode = self.mode_at(self.calls)
        self.calls += 1
        self.modes.append(mode)
        return Decision(tuple(p.sharing_ffn(mode, p.shared_ffn[1]).name() for p in self.base))
