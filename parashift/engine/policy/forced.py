"""An administrator's width over any policy (`POST /v1/parallel/layout`,
`LLM.set_layout`): while a width is forced the node moves, one merge or split at a time,
to that width's layout and stays there, each group's plan still the policy's pick once it
is there; with no width forced the policy decides alone."""
from parashift.engine.policy.protocol import Decision, NodeView, Policy
from parashift.engine.policy.widths import transition_towards


class ForcedWidth:
    reads_view = True  # it reads the layout

    def __init__(self, policy: Policy, layouts: dict[int, tuple[str, ...]]):
        self.policy, self.layouts = policy, layouts
        self.plans = policy.plans
        self.name = policy.name
        self.reads_requests = getattr(policy, "reads_requests", False)
        self.width: int | None = None

    @property
    def acts_when_idle(self) -> bool:  # a forced width applies at once
        return self.width is not None or getattr(self.policy, "acts_when_idle", False)

    def force(self, width: int | None) -> None:
        if width is not None and width not in self.layouts:
            raise ValueError(f"width {width} is not one this node can take; widths: "
                             f"{sorted(self.layouts)}")
        self.width = width

    def decide(self, view: NodeView) -> Decision:
        if self.width is None:
            return self.policy.decide(view)
        transition = transition_towards(view.layout, self.layouts[self.width])
        if transition is not None:
            return Decision(view.layout, (transition,))
        return Decision(self.policy.decide(view).plans)  # its plans, none of its transitions
