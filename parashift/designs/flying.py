"""Flying Serving's options (policy: engine/policy/flying.py)."""
from dataclasses import dataclass

from parashift.designs.options import DesignOptions

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

    def __post_init__(self):
        if self.preemption not in FLYING_PREEMPTIONS:
            raise ValueError(f"flying_preemption must be one of {FLYING_PREEMPTIONS}, got "
                             f"{self.preemption!r}")
