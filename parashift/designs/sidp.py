"""SiDP's options (policy: engine/policy/sidp.py; the rank's side: worker/shared_ffn.py).
The data-parallel replicas share their FFN weights, each rank holding a 1/dp slice of every
FFN layer; steps run them as Weight-as-a-Service ("was": slices fetched into slots) or
Compute-as-a-Service ("cas": tokens sent to the slices). The sidp policy switches by
batch_threshold; under the static policy `mode` holds."""
from dataclasses import dataclass

from parashift.designs.options import (DesignOptions, check_hint_use, check_positive_int,
                                       check_workload_hint)


@dataclass
class SidpConfig(DesignOptions):
    prefix = "sidp_"
    unprefixed = ("share_ffn",)
    share_ffn: bool = False
    mode: str = "cas"                   # the static policy's mode: cas | was
    slots: int = 2                      # WaS: layers held at once (fetched ahead)
    # sidp policy: WaS above this many tokens per busy replica's step (B_th; 604 for
    # Qwen3-32B at d = 2 on H200, benchmarks/results/sidp_probe_h200.json), with hysteresis
    batch_threshold: int = 600
    probe_file: str | None = None       # sidp policy: B_th from sidp_probe.py's JSON instead
    min_dwell_steps: int = 8            # sidp policy: least steps between switches
    # sidp policy with cost_profile: the workload told (mean lengths; an offline batch's
    # request count, or the online arrival rate a second), the start-up compares SiDP with
    # every static plan of the same GPUs (cost/plan_choice.py) and, where a static plan is
    # predicted to win, runs that one under the static policy (engine/static_fallback.py);
    # workload_file: the lengths, a JSON list of [prompt, output] pairs, instead of the means
    # (or [prompt, output, arrival_s] triples: an online trace, cost/forecast_trace.py)
    mean_prompt_tokens: int | None = None
    mean_output_tokens: int | None = None
    num_requests: int | None = None
    request_rate: float | None = None
    workload_file: str | None = None

    def __post_init__(self):
        if self.mode not in ("cas", "was"):
            raise ValueError(f"sidp_mode must be cas or was, got {self.mode!r}")
        for name in ("slots", "batch_threshold", "min_dwell_steps"):
            check_positive_int(f"sidp_{name}", getattr(self, name))
        check_workload_hint("sidp_", self)

    def check(self, engine) -> None:
        if engine.parallel_policy == "sidp":
            self.share_ffn = True
        if not isinstance(self.share_ffn, bool):
            raise ValueError(f"share_ffn must be true or false, got {self.share_ffn!r}")
        if self.probe_file is not None and engine.parallel_policy != "sidp":
            raise ValueError("sidp_probe_file is an option of the sidp policy "
                             "(parallel_policy='sidp')")
        check_hint_use("sidp_", self, engine, "sidp")
        if not self.share_ffn:
            return
        if engine.data_parallel_size < 2:
            raise ValueError("shared FFN weights (SiDP) need data_parallel_size >= 2: the "
                             f"replicas share them, got {engine.data_parallel_size}")
        others = [n for n in ("sequence_parallel_size", "pipeline_parallel_size")
                  if getattr(engine, n) != 1]
        if others or engine.layout is not None:
            raise ValueError("shared FFN weights (SiDP) are for DP replicas of plain TP: drop "
                             f"{others[0] if others else 'layout'}")
        if engine.parallel_policy not in ("static", "sidp"):
            raise ValueError("shared FFN weights (SiDP) run under the static or sidp policy, "
                             f"got {engine.parallel_policy}")
        if engine.deterministic:
            raise ValueError("deterministic mode does not cover shared FFN weights (SiDP) yet")
