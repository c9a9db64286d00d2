"""Flying Serving's options (policy: engine/policy/flying.py)."""
from dataclasses import dataclass

from parashift.designs.options import DesignOptions, check_hint_use, check_workload_hint

FLYING_PREEMPTIONS = ("auto", "soft", "hard", "recompute")


@dataclass
class FlyingConfig(DesignOptions):
    prefix = "flying_"
    merge_running: int = 4   # merge at or below this many running
    dwell_s: float = 2.0     # least seconds from a transition to a merge
    # a merge or split's running requests: auto (as the policy's transition says) | soft
    # (finish in their old plan, interleaved with the new groups' steps) | hard (paused while
    # the new groups have more urgent requests) | recompute (moved, computed again)
    preemption: str = "auto"
    # with cost_profile, the workload told (as shift_* and sidp_*): the start-up forecasts
    # the layouts of every width (cost/plan_choice.py) and the policy merges no wider than
    # the best one's (engine/policy/flying.py)
    mean_prompt_tokens: int | None = None
    mean_output_tokens: int | None = None
    num_requests: int | None = None
    request_rate: float | None = None
    workload_file: str | None = None

    def __post_init__(self):
        if self.preemption not in FLYING_PREEMPTIONS:
            raise ValueError(f"flying_preemption must be one of {FLYING_PREEMPTIONS}, got "
                             f"{self.preemption!r}")
        check_workload_hint("flying_", self)

    def check(self, engine) -> None:
        check_hint_use("flying_", self, engine, "flying")
