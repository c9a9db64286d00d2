"""The points where a design changes what a rank does, called by the model runner in
order over the rank's hooks (worker/seesaw.py's SeesawRank, worker/shared_ffn.py's
SharedFfn); every default does nothing. A design registers the factory of its hooks in
parashift/designs/ (`rank_hooks`): `factory(setup) -> RankHooks | None`, None where the
design does not run on this rank."""
from dataclasses import dataclass, field
from typing import Callable

import torch

from parashift.designs import DESIGNS
from parashift.parallel.state import GroupHandle, ParallelState
from parashift.startup_phases import StartupPhases


@dataclass
class RankSetup:
    """What a design's hooks are made from on one rank, once its base model is loaded."""
    config: object                      # EngineConfig
    hf_config: object
    source: object                      # where the weights load from
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    state: ParallelState                # the base plan's
    other_states: tuple[ParallelState, ...]
    model: torch.nn.Module              # the base plan's, loaded
    build_model: Callable[[ParallelState], torch.nn.Module]  # another plan's, loaded
    group: GroupHandle | None           # this rank's group, where a design exchanges in it
    # loads the base plan's weights again into `model` (the base model, its parameters
    # moved): where a design can place them anew instead of keeping a copy (None: cannot)
    reload_weights: Callable[[torch.nn.Module], None] | None = None
    phases: StartupPhases = field(default_factory=StartupPhases)  # the rank's start-up timing


class RankHooks:
    # each plan reads the KV pool in its own shape (the pool's block size, its own layers
    # and heads), its views bound by `bind_kv` for good
    kv_views_per_plan = False
    # CUDA graphs by default where only some plans can replay them
    graphs_for_some_plans = False
    # steps that prefill may replay graphs
    mixed_step_graphs = True

    def bind_kv(self, kv) -> None:
        """The KV pool is made and every plan's view of it warmed up."""

    # the blocks every plan's view of the pool holds, where fewer than the pool's
    num_blocks: int | None = None

    def model_for(self, plan_name: str) -> torch.nn.Module | None:
        """The model steps of `plan_name` run, where not the runner's own."""
        return None

    def running_model(self) -> torch.nn.Module | None:
        """The model steps run now, where the design switches it (after a move)."""
        return None

    @staticmethod
    def replays_graphs(plan) -> bool:
        """Whether the decode steps of `plan` (its PlanResources) may replay CUDA graphs."""
        return True

    def before_capture(self, plan, rows: int) -> None:
        """Before a graph of `rows` rows of `plan` is captured."""

    def graph_rows(self) -> int | None:
        """The least rows this step's graph bucket holds (0: any), or None: run it eagerly."""
        return 0

    def take_swaps(self, batch, swap_shape) -> bool:
        """The step's swaps, where the design moves the KV itself (then True; else the
        runner's swap preemption runs them)."""
        return False

    def before_step(self, batch, graphs) -> None:
        """Before the step's forward (`graphs`: the runner's StepGraphs, or None)."""

    def step_without_tokens(self, batch, plan) -> None:
        """A step with no tokens on this rank, under `plan`."""

    def before_profile_step(self) -> None:
        """Before the start-up memory profile's step."""

    def after_profile_step(self) -> None:
        """After it."""

    def move(self, verb: str, plan_name: str, moves: list, tier) -> dict | None:
        """A transition's move on this rank, returning its stats (None: not this design's)."""
        return None

    def report_memory(self, kv_bytes: int) -> None:
        """The start-up line of what the design holds, once the KV pool is made."""

    def stats(self) -> dict:
        return {}

    def checksums(self) -> dict:
        return {}


def hooks_for_rank(setup: RankSetup) -> list[RankHooks]:
    """The hooks of every design that runs on this rank, in the registry's order."""
    hooks = (design.make_rank_hooks(setup) for design in DESIGNS.values())
    return [hook for hook in hooks if hook is not None]
