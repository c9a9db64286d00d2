"""Shift Parallelism's options (policy: engine/policy/shift.py; its second weight layout:
parallel/shift_weights.py)."""
from dataclasses import dataclass

from parashift.designs.options import DesignOptions, check_hint_use, check_workload_hint

SHIFT_WEIGHTS_MODES = ("reorder", "slice", "separate")


@dataclass
class ShiftConfig(DesignOptions):
    prefix = "shift_"
    threshold: int = 256     # steps of at most this many tokens use TP
    # (256: the crossover measured on 2xH200, docs/benchmark_log.md: for the 8B shape the shift
    # plan wins decode steps up to 256 sequences and loses at 512; Qwen3-32B's wins to 1024)
    weights: str = "reorder"  # reorder | slice | separate
    # shift policy with cost_profile: the workload told (as SiDP's, designs/sidp.py), the
    # start-up runs the best static plan instead where the cost model predicts it beats Shift
    # over the SP plan (engine/static_fallback.py)
    mean_prompt_tokens: int | None = None
    mean_output_tokens: int | None = None
    num_requests: int | None = None
    request_rate: float | None = None
    workload_file: str | None = None

    def __post_init__(self):
        if self.weights not in SHIFT_WEIGHTS_MODES:
            raise ValueError("shift_weights must be reorder, slice or separate, "
                             f"got {self.weights!r}")
        check_workload_hint("shift_", self)

    def check(self, engine) -> None:
        check_hint_use("shift_", self, engine, "shift")
