"""Seesaw's options (policy: engine/policy/seesaw.py; the rank's side: worker/seesaw.py;
the CPU KV tier: engine/seesaw.py). Each group prefills under prefill_plan and decodes
under decode_plan (same ranks), its KV moved between the two through a CPU tier of
cpu_kv_tokens (or cpu_kv_gib)."""
import re
from dataclasses import dataclass

from parashift.designs.options import HINT_FIELDS, DesignOptions, check_workload_hint

SEESAW_FIELDS = ("prefill_plan", "decode_plan", "cpu_kv_tokens", "cpu_kv_gib")
SEESAW_WEIGHT_SOURCES = ("auto", "host", "peers")
AUTO_PLAN_FIELDS = HINT_FIELDS  # read by prefill_plan='auto' only, cleared once it chose
AUTO_PLAN = re.compile(r"auto(?::([1-9][0-9]*))?")  # auto, or auto:<ranks per group>


@dataclass
class SeesawConfig(DesignOptions):
    prefix = "seesaw_"
    unprefixed = SEESAW_FIELDS
    # prefill_plan auto (or auto:<ranks per group>): the pair, or a static plan where no pair
    # pays, chosen at start-up by policy/seesaw_cost.py for prompts and outputs of the mean
    # lengths below (None: 1024 and 128, vLLM's benchmark lengths) and, given, the requests held
    # at once (an offline batch, or the concurrency when serving; None: steady state, every
    # replica at max_num_seqs), which bounds the decode batch; decode_plan omitted or auto
    prefill_plan: str | None = None          # e.g. pp2, pp2xtp2, auto
    decode_plan: str | None = None           # e.g. tp2
    mean_prompt_tokens: int | None = None
    mean_output_tokens: int | None = None
    num_requests: int | None = None
    # with cost_profile: online arrivals a second (the choice then ranks by a request's
    # latency, as `plan --recommend` ranks online plans), and the requests' lengths from a
    # JSON list of [prompt, output] pairs instead of the means and count
    request_rate: float | None = None
    workload_file: str | None = None
    cpu_kv_tokens: int | None = None
    cpu_kv_gib: float | None = None
    max_prefill_ms: float = 0.0              # a prefill phase ends after this long (0: unbounded)
    # both plans' weight shards stay on the device (a transition copies no weights; the KV
    # pool is smaller by the other plan's shard); False: one arena the larger shard's size
    resident_weights: bool = False
    # where a transition's missing weight shards come from: "host" (the pinned host copies)
    # | "peers" (the group's ranks whose old plan holds them, host copies for the rest;
    # parallel/reshard_schedule.py) | "auto": peers from a safetensors checkpoint where every GPU
    # of the group reaches the others directly inside one host (on two H200s 2-3x faster than
    # host copies, docs/benchmark_log.md), else host
    weight_source: str = "auto"

    def __post_init__(self):
        if not isinstance(self.resident_weights, bool):
            raise ValueError("seesaw_resident_weights must be true or false, got "
                             f"{self.resident_weights!r}")
        if self.weight_source not in SEESAW_WEIGHT_SOURCES:
            raise ValueError(f"seesaw_weight_source must be one of {SEESAW_WEIGHT_SOURCES}, "
                             f"got {self.weight_source!r}")
        if self.weight_source == "peers" and self.resident_weights:
            raise ValueError("seesaw_weight_source='peers' re-shards weights, "
                             "seesaw_resident_weights keeps both plans' shards resident: "
                             "give one")
        for name in HINT_FIELDS:
            if getattr(self, name) is not None and not self.auto_plans:
                raise ValueError(f"seesaw_{name} is an option of prefill_plan='auto'")
        check_workload_hint("seesaw_", self)

    @property
    def auto_plans(self) -> bool:
        """prefill_plan='auto': the plans are the cost model's choice, made at start-up."""
        return isinstance(self.prefill_plan, str) and AUTO_PLAN.fullmatch(self.prefill_plan) is not None

    def given(self) -> list[str]:
        """The flat keywords given that only the seesaw policy takes."""
        given = [name for name in SEESAW_FIELDS if getattr(self, name) is not None]
        given += ["seesaw_resident_weights"] if self.resident_weights else []
        return given + (["seesaw_weight_source"] if self.weight_source == "peers" else [])

    def check(self, engine) -> None:
        if engine.parallel_policy != "seesaw":
            given = self.given()
            if given:
                raise ValueError(f"{given[0]} is an option of the seesaw policy "
                                 "(parallel_policy='seesaw')")
            return
        self._check_plans()
        modelled = [n for n in ("request_rate", "workload_file") if getattr(self, n) is not None]
        if modelled and engine.cost_profile is None:
            raise ValueError(f"seesaw_{modelled[0]} is read by the cost model: give cost_profile")
        if (self.cpu_kv_tokens is None) == (self.cpu_kv_gib is None):
            raise ValueError("the seesaw policy needs its CPU KV tier sized by one of "
                             "cpu_kv_tokens or cpu_kv_gib")
        if self.cpu_kv_tokens is not None and self.cpu_kv_tokens < 1:
            raise ValueError(f"cpu_kv_tokens must be >= 1, got {self.cpu_kv_tokens}")
        if self.cpu_kv_gib is not None and not self.cpu_kv_gib > 0:
            raise ValueError(f"cpu_kv_gib must be > 0, got {self.cpu_kv_gib}")
        if not self.max_prefill_ms >= 0:
            raise ValueError("seesaw_max_prefill_ms must be >= 0 (0: unbounded), got "
                             f"{self.max_prefill_ms}")
        others = [n for n in ("tensor_parallel_size", "sequence_parallel_size",
                              "pipeline_parallel_size") if getattr(engine, n) != 1]
        if others or engine.layout is not None:
            raise ValueError("under the seesaw policy prefill_plan and decode_plan give each "
                             "group's plans (data_parallel_size the groups): drop "
                             f"{others[0] if others else 'layout'}")
        if engine.preemption_mode == "swap":
            raise ValueError("preemption_mode='swap' does not go with the seesaw policy: its "
                             "CPU KV tier already holds every request's KV (its preempted "
                             "requests keep their slots); drop preemption_mode")

    def _check_plans(self) -> None:
        if self.auto_plans:
            if self.decode_plan not in (None, "auto"):
                raise ValueError("prefill_plan='auto' chooses the decode plan too: omit "
                                 f"decode_plan or give 'auto', got {self.decode_plan!r}")
            return
        for name in ("prefill_plan", "decode_plan"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"the seesaw policy needs {name} (e.g. prefill_plan='pp2', "
                                 "decode_plan='tp2', or prefill_plan='auto')")
            _check_plan_name(name, getattr(self, name))


def _check_plan_name(field_name: str, value: str) -> None:
    from parashift.parallel.plan import Plan
    try:
        Plan.parse(value)
    except ValueError as e:
        raise ValueError(f"{field_name} must be auto, auto:<ranks per group> (prefill_plan "
                         "only) or a plan such as pp2, pp2xtp2 or tp2, got "
                         f"{value!r} ({e})") from None
