"""What each plan a rank may run needs on that rank, made once at start-up and looked
up by the plan's name in every step (the step message carries the name)."""
from dataclasses import dataclass

from parashift.context import BASE_WEIGHTS, StepContext
from parashift.parallel.plan import Plan
from parashift.worker.shared_ffn import LAYOUT_OF_MODE
from parashift.parallel.shift_weights import SHIFT_WEIGHTS
from parashift.parallel.state import ParallelState


@dataclass(frozen=True)
class PlanResources:
    """One plan on one rank: its process groups, the key of the weight layout its layers
    use, its view of the KV pool (KV heads per rank, tokens per block), whether this rank
    reports the step's sampled tokens, and the key of its CUDA graphs."""
    state: ParallelState
    weights: str
    kv_heads: int
    block_size: int
    narrowing: tuple[int, int] | None = None  # (factor, position) of its weight layout

    @property
    def plan(self) -> Plan:
        return self.state.plan

    @property
    def name(self) -> str:
        return self.plan.name()

    @property
    def is_output_rank(self) -> bool:
        """The plan's output rank: last pipeline stage, first SP and TP position."""
        s = self.state
        return s.is_last_stage and s.tp.rank == 0 and s.sp.rank == 0

    @property
    def graph_key(self) -> str:
        return self.name

    def context(self, attn=None, backend=None) -> StepContext:
        return StepContext(self.state, self.weights, attn, backend)


def weight_layout_of(plan: Plan, rank: int) -> str:
    """The weight layout a plan's layers use on `rank`: the loaded shard, the shift plan's,
    or a merged plan's slice of the replica (one per width and position)."""
    if plan.shared_ffn is not None:
        return LAYOUT_OF_MODE[plan.shared_ffn[0]]
    narrowing = plan.narrowing(rank)
    if narrowing is None:
        return BASE_WEIGHTS
    return SHIFT_WEIGHTS if plan.shift_base is not None else "merge{}.{}".format(*narrowing)


def make_resources(states: list[ParallelState], kv_view_of) -> dict[str, PlanResources]:
    """Resources of every plan, by name; `kv_view_of(plan)` is its (KV heads per rank,
    tokens per block) over this rank's pool."""
    return {s.plan.name(): PlanResources(s, weight_layout_of(s.plan, s.rank), *kv_view_of(s.plan),
                                         s.plan.narrowing(s.rank))
            for s in states}
