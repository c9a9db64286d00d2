"""The policy protocol: `decide(view) -> decision`, called before each round of scheduling.

This file and `Node.next_round` (engine/node.py), whose decision `LLMEngine._submit_round`
carries to the workers, are where a plan switch is decided and carried; `ModelRunner.launch`
(worker/model_runner.py) applies it. Policies are pure functions of the view: no
tensors, no engine objects, so each is unit-tested on recorded views."""
from dataclasses import dataclass, field
from typing import Protocol

from parashift.parallel.plan import Plan


@dataclass(frozen=True)
class GroupView:
    """One group of the node layout as the scheduler sees it before a step."""
    plan: str                  # the plan its last step ran under
    num_waiting: int
    num_running: int
    tokens_waiting: int        # prompt tokens of waiting requests still to compute
    next_step_tokens: int      # tokens its next step would schedule (an estimate)
    kv_blocks_used: int
    kv_blocks_free: int
    priorities: tuple[int, ...] = ()  # distinct priorities of its requests, ascending
    longest_context: int = 0   # tokens of its longest running request
    arrival_rate: float = 0.0  # requests per second added to it over the recent window
    cpu_tier_fill: float = 0.0  # fraction of its CPU KV tier in use (no tier yet: 0)
    cpu_tier_free_run: int = 0  # tokens of its CPU KV tier's largest free range (slot)
    next_prompt_tokens: int = 0  # prompt tokens of its first waiting request (0: none waits)
    kv_capacity: int = 0       # tokens one request can hold in it (its KV pool, max_model_len)
    longest_need: int = 0      # the most tokens one of its requests may reach (prompt + max_tokens)
    longest_decode_left: int = 0  # tokens its running requests may still generate, the most of one
    recompute_tokens: int = 0  # tokens its requests compute again if they move to another group
    step_s: float = 0.0        # seconds of its last decode step, or last step before one (0: none)
    # prompt tokens a second per rank of its plan, in its last step long enough to tell (0:
    # none yet); the switch costs read it as one replica's rate
    prefill_tokens_per_s: float = 0.0
    prompt_tokens_left: int = 0  # prompt tokens its running requests still compute (seesaw)
    waiting_decode_most: int = 0  # tokens a waiting request may generate, the most of one


@dataclass(frozen=True)
class NodeView:
    groups: tuple[GroupView, ...]  # one per group of the layout, in order
    time: float = 0.0
    layout: tuple[str, ...] = ()   # each group's plan in the node layout, by name
    # The longest context one group holds, per width (replicas merged) the node can take.
    max_context: tuple[tuple[int, int], ...] = ()
    unplaced_need: int = 0  # tokens the longest request no group holds yet needs (0: none)
    # Each plan's decode step in seconds (the median of its last few), of the plans that ran
    # one, any group, any time: what a merge's cost check reads of the merged plan before
    # the node runs it.
    decode_step_s: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Transition:
    """A change of the node layout (merge, split, re-shard) over some groups."""
    kind: str
    groups: tuple[int, ...]
    target: str  # the plan the groups run once it commits
    # a merge or split's running requests: "soft" (they finish where their KV was written,
    # between the new groups' steps), "hard" (paused while the new groups have more urgent
    # requests) or "recompute" (moved, computed again); None: soft. `--flying-preemption`
    # other than auto overrides it.
    preemption: str | None = None


@dataclass(frozen=True)
class Decision:
    plans: tuple[str, ...]  # each group's plan for its next step, by name
    transitions: tuple[Transition, ...] = field(default=())


class Policy(Protocol):
    name: str
    # Every plan it may pick (made on every rank at start-up); the plans of the starting
    # layout come first, in group order: they fix each rank's weights and KV layout.
    plans: list[Plan]
    # False where decide() ignores the view (static): the engine then skips building it, which
    # walks every running request each step. Policies without the attribute get a view.
    reads_view: bool
    # True where decide() reads the view's per-request fields (longest_need, longest_decode_left,
    # recompute_tokens): the engine then walks every request, waiting ones too, to fill them.
    reads_requests: bool
    # True where decide() may change the layout of an idle node (the engine then asks it
    # between requests, `LLMEngine.idle_turn`). Policies without the attribute are asked
    # only when a step runs.
    acts_when_idle: bool

    def decide(self, view: NodeView) -> Decision: ...

