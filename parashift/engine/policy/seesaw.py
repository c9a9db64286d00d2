"""Seesaw (arXiv 2503.06433): each group prefills under a prefill plan (PP, or PP x TP)
and decodes under a decode plan (TP, or TP x PP) of the same ranks, re-sharding weights
and KV between the two phases. Transition-minimizing scheduling (§4.2): a group prefills
whole prompts into the CPU KV tier until the tier cannot hold the next waiting prompt or
none waits, then decodes until every request the tier held has been loaded into the
decode plan's pool (the tier is empty), and prefills again only if a prompt waits; it
never switches more often. For online serving a prefill phase also ends after
`max_prefill_ms` when there is something to decode, so streams keep flowing (the paper
is offline only). The phase of each group is the policy's only state."""
from parashift.engine.policy.protocol import Decision, GroupView, NodeView, Transition
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan

PREFILL, DECODE = "prefill", "decode"


def seesaw_plans(prefill: str, decode: str, ranks: tuple[int, ...]) -> tuple[Plan, Plan]:
    """The two plans over one group's ranks; refuses pairs Seesaw cannot switch between."""
    p, d = Plan.parse(prefill), Plan.parse(decode)
    if p.world_size != len(ranks) or d.world_size != len(ranks):
        raise ValueError(f"seesaw plans {prefill} and {decode} must each cover the group's "
                         f"{len(ranks)} ranks (same world size; DP is the layout's groups)")
    p, d = p.on(ranks), d.on(ranks)
    if p.dp != 1 or d.dp != 1 or p.sp != 1 or d.sp != 1:
        raise ValueError("seesaw plans are PP x TP (no dp or sp degrees: data parallelism is "
                         f"the layout's groups), got {prefill} and {decode}")
    if (p.pp, p.tp) == (d.pp, d.tp):
        raise ValueError(f"the seesaw prefill and decode plans are the same ({prefill}): use "
                         "the static policy")
    return p, d


class SeesawPolicy:
    name = "seesaw"
    reads_requests = False

    def __init__(self, layout: Layout, prefill: str, decode: str, max_prefill_ms: float = 0.0):
        if not max_prefill_ms >= 0:
            raise ValueError(f"seesaw_max_prefill_ms must be >= 0 (0: unbounded), got {max_prefill_ms}")
        pairs = [seesaw_plans(prefill, decode, plan.ranks) for plan in layout.plans]
        if any(plan != p for plan, (p, _) in zip(layout.plans, pairs)):
            raise ValueError(f"the seesaw policy starts each group in its prefill plan {prefill}, "
                             f"got layout {layout.name()}")
        self.pairs = pairs
        self.plans = [p for p, _ in pairs] + [d for _, d in pairs]
        self.max_prefill_s = max_prefill_ms / 1000
        self.phases = [PREFILL] * len(pairs)
        self.since = [None] * len(pairs)  # when each group's phase began (view time)

    def decide(self, view: NodeView) -> Decision:
        transitions = []
        for g, group in enumerate(view.groups):
            if self.since[g] is None:
                self.since[g] = view.time
            if self._switches(g, group, view.time):
                self.phases[g] = DECODE if self.phases[g] == PREFILL else PREFILL
                self.since[g] = view.time
                transitions.append(Transition("reshard", (g,), (self._plan(g).name(),)))
        return Decision(tuple(self._plan(g).name() for g in range(len(self.pairs))),
                        tuple(transitions))

    def _plan(self, g: int) -> Plan:
        return self.pairs[g][self.phases[g] == DECODE]

    def _switches(self, g: int, group: GroupView, now: float) -> bool:
        """Prefill -> decode once no waiting prompt fits the tier (or none waits) and the
        admitted prompts are computed whole, or once the phase's time is up, when there is
        something to decode; decode -> prefill once the tier is empty and a prompt waits.
        A stalled prefill phase (no room left: free run 0) switches with prompts unfinished;
        the decode plan computes the rest."""
        if self.phases[g] == DECODE:
            return group.cpu_tier_fill == 0 and group.num_waiting > 0
        to_decode = group.cpu_tier_fill > 0 or group.num_running > 0
        tier_full = group.num_waiting > 0 and group.next_prompt_tokens > group.cpu_tier_free_run
        prompts_done = group.prompt_tokens_left == 0 or group.cpu_tier_free_run == 0
        timed_out = self.max_prefill_s > 0 and now - self.since[g] >= self.max_prefill_s
        return to_decode and (timed_out or prompts_done and (group.num_waiting == 0 or tier_full))


def policy_from_config(config, layout: Layout, hf_config) -> SeesawPolicy:
    return SeesawPolicy(layout, config.seesaw.prefill_plan, config.seesaw.decode_plan,
                        config.seesaw.max_prefill_ms)
