"""What each plan a rank may run needs on that rank, made once at start-up and looked
up by the plan's name in every step (the step message carries the name)."""
from dataclasses import dataclass

from parashift.context import BASE_WEIGHTS, StepContext
from parashift.parallel.plan import Plan
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


def weight_layout_of(plan: Plan) -> str:
    """The weight layout a plan's layers use: the loaded shard, or the shift plan's."""
    return SHIFT_WEIGHTS if plan.shift_base is not None else BASE_WEIGHTS


def make_resources(states: list[ParallelState], kv_heads_of, block_size: int
                   ) -> dict[str, PlanResources]:
    """Resources of every plan, by name; `kv_heads_of(state)` is a plan's KV heads per rank."""
    return {s.plan.name(): PlanResources(s, weight_layout_of(s.plan), kv_heads_of(s), block_size)
            for s in states}
