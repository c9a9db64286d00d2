"""Engine configuration as validated dataclasses."""
import re
from dataclasses import dataclass, fields


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # token budget of one step
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # cap on one request's tokens per step; 0 = none

    def __post_init__(self):
        minimum = {"long_prefill_token_threshold": 0}
        for f in fields(self):
            value = getattr(self, f.name)
            low = minimum.get(f.name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{f.name} must be an integer >= {low}, got {value!r}")


PARALLEL_POLICIES = ("static", "shift", "flying", "seesaw", "sidp")
SEESAW_FIELDS = ("prefill_plan", "decode_plan", "cpu_kv_tokens", "cpu_kv_gib")
SEESAW_WEIGHT_SOURCES = ("auto", "host", "peers")
AUTO_PLAN_FIELDS = ("seesaw_mean_prompt_tokens", "seesaw_mean_output_tokens", "seesaw_num_requests")
AUTO_PLAN = re.compile(r"auto(?::([1-9][0-9]*))?")  # auto, or auto:<ranks per group>
FLYING_PREEMPTIONS = ("auto", "soft", "hard", "recompute")
PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
OUTPUT_PROCESSORS = ("auto", "thread", "inline", "process")


@dataclass
class EngineConfig:
    """Everything `LLM(...)`, the CLI and the server accept; unknown names are errors."""
    model: str | None = None                 # HF dir, .gguf, config .json (random weights); None = embedded
    tokenizer: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None         # default: the model's max_position_embeddings
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None       # step token budget; None: by device
    long_prefill_token_threshold: int | None = None  # one request's cap per step; None: budget/2
    enable_prefix_caching: bool = True
    seed: int = 0
    block_size: int = 16
    num_blocks: int | None = None            # KV pool size in blocks; overrides the memory sizing
    kv_cache_memory: int | None = None       # KV pool size in bytes
    gpu_memory_utilization: float = 0.9
    attention_backend: str = "auto"          # auto | torch | triton
    load_format: str = "auto"                # auto | dummy (random weights)
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False          # transformers may run the model's own config code
    chat_template: str | None = None         # a Jinja file or the template; None: the tokenizer's
    generation_config: str = "auto"          # request defaults: auto (model's) | vllm | a folder
    tensor_parallel_size: int = 1
    sequence_parallel_size: int = 1
    data_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pp_micro_batch_tokens: int = 256         # least tokens of one pipeline micro-batch
    layout: str | None = None                # groups in rank order, e.g. "tp2,single,single"
    worker_timeout_s: float = 600.0          # a worker's start-up, or a transition, slower fails
    worker_step_timeout_s: float = 60.0      # a step slower than this loses its ranks (they hang)
    worker_heartbeat_timeout_s: float = 10.0  # a running worker silent this long is dead (frozen)
    # (a worker beats every 0.2 s from a thread of its own, through long steps too: torch ops
    # release the GIL; 10 s leaves room for a kernel compile that holds it for a few seconds.
    # A worker the kernel shows stopped (SIGSTOP) is dead after 1 s of silence:
    # executor/multiproc.py's STOPPED_TIMEOUT_S.)
    parallel_policy: str = "static"          # static | shift | flying | seesaw
    shift_threshold: int = 256               # shift policy: steps of at most this many tokens use TP
    # (256: the crossover measured on 2xH200, docs/benchmarks.md: for the 8B shape the shift
    # plan wins decode steps up to 256 sequences and loses at 512; Qwen3-32B's wins to 1024)
    shift_weights: str = "reorder"           # shift policy: reorder | slice | separate
    merge_weights: str = "reorder"           # merged plans: reorder | view | materialize
    # mixture-of-experts models: tp (each expert's width split over TP) | ep (whole experts
    # split over the attention group's SP x TP ranks; vLLM's --enable-expert-parallel)
    moe_parallel: str = "tp"
    flying_merge_running: int = 4            # flying policy: merge at or below this many running
    flying_dwell_s: float = 2.0              # flying policy: least seconds from a transition to a merge
    # a merge or split's running requests: auto (as the policy's transition says) | soft
    # (finish in their old plan, interleaved with the new groups' steps) | hard (paused while
    # the new groups have more urgent requests) | recompute (moved, computed again)
    flying_preemption: str = "auto"
    # seesaw policy: each group prefills under prefill_plan and decodes under decode_plan (same
    # ranks), its KV moved between the two through a CPU tier of cpu_kv_tokens (or cpu_kv_gib)
    # prefill_plan auto (or auto:<ranks per group>): the pair, or a static plan where no pair
    # pays, chosen at start-up by policy/seesaw_cost.py for prompts and outputs of the mean
    # lengths below (None: 1024 and 128, vLLM's benchmark lengths) and, given, the requests held
    # at once (an offline batch, or the concurrency when serving; None: steady state, every
    # replica at max_num_seqs), which bounds the decode batch; decode_plan omitted or auto
    prefill_plan: str | None = None          # e.g. pp2, pp2xtp2, auto
    decode_plan: str | None = None           # e.g. tp2
    seesaw_mean_prompt_tokens: int | None = None
    seesaw_mean_output_tokens: int | None = None
    seesaw_num_requests: int | None = None
    cpu_kv_tokens: int | None = None
    cpu_kv_gib: float | None = None
    seesaw_max_prefill_ms: float = 0.0       # a prefill phase ends after this long (0: unbounded)
    # both plans' weight shards stay on the device (a transition copies no weights; the KV
    # pool is smaller by the other plan's shard); False: one arena the larger shard's size
    seesaw_resident_weights: bool = False
    # where a transition's missing weight shards come from: "host" (the pinned host copies)
    # | "peers" (the group's ranks whose old plan holds them, host copies for the rest;
    # parallel/reshard_schedule.py) | "auto": peers from a safetensors checkpoint where every GPU
    # of the group reaches the others directly inside one host (on two H200s 2-3x faster than
    # host copies, docs/benchmarks.md), else host
    seesaw_weight_source: str = "auto"
    # a request preempted when the KV pool runs out: recompute (its blocks freed, computed
    # again when resumed) | swap (its KV copied to a CPU tier of swap_space GiB per group and
    # back when resumed; recompute when the tier is full). vLLM v0's names.
    preemption_mode: str = "recompute"
    swap_space: float | None = None
    # SiDP: the data-parallel replicas share their FFN weights, each rank holding a 1/dp slice
    # of every FFN layer; steps run them as Weight-as-a-Service ("was": slices fetched into
    # slots) or Compute-as-a-Service ("cas": tokens sent to the slices). The sidp policy
    # switches by sidp_batch_threshold; under the static policy sidp_mode holds.
    share_ffn: bool = False
    sidp_mode: str = "cas"                   # static policy's mode: cas | was
    sidp_slots: int = 2                      # WaS: layers held at once (fetched ahead)
    # sidp policy: WaS above this many tokens per busy replica's step (B_th; 604 for
    # Qwen3-32B at d = 2 on H200, benchmarks/results/sidp_probe_h200.json), with hysteresis
    sidp_batch_threshold: int = 600
    sidp_probe_file: str | None = None       # sidp policy: B_th from sidp_probe.py's JSON instead
    sidp_min_dwell_steps: int = 8            # sidp policy: least steps between switches
    timeline_file: str | None = None         # JSONL: one line per step (plan, tokens, seconds)
    cuda_graphs: bool | None = None          # steps as CUDA graphs; None = where possible
    # with them, steps that prefill too (<= 2,048 rows, <= 64 sequences; single-stage plans,
    # not in deterministic mode nor with shared FFN weights or Seesaw)
    mixed_step_graphs: bool = True
    fast_all_reduce: bool = True             # CUDA: small all-reduces over symmetric memory
    async_scheduling: bool | None = None     # schedule the next step while one runs; None = auto
    check_step_state: bool = False           # debug: every step's persistent inputs against a rebuild
    # detokenization, stop strings and RequestOutputs: on the engine loop (inline), on a
    # thread of their own (thread: outputs come a step later; on an H100 the thread took the
    # GIL from the loop and gained 0-5%, docs/benchmarks.md) or in a process of their own
    # (process: the loop hands tokens over and assembles the outputs); the same outputs.
    # auto: process on a GPU host with a tokenizer and 4+ cores, else inline
    output_processor: str = "auto"
    # the engine core (scheduler, executor) in a process of its own, as vLLM v1 runs it: the
    # caller's process makes the outputs (detokenization, stop strings, RequestOutputs).
    # None: on for the server on a GPU host of 4+ cores, off otherwise (core_client.py)
    engine_core_process: bool | None = None
    # batch- and plan-invariant kernels: the same tokens and logprobs whatever the batch,
    # the plan or a switch (parashift/deterministic/)
    deterministic: bool = False
    # Beyond one host (torchrun's and SGLang's names): node_rank 0 runs the engine and the
    # HTTP server, the others only their workers; ranks are numbered host by host.
    nnodes: int = 1
    node_rank: int = 0
    gpus_per_node: int | None = None         # ranks per host; None: world size / nnodes
    master_addr: str = "127.0.0.1"           # node 0's address (torch's rendezvous there)
    master_port: int = 29500                 # rendezvous port (torchrun's default); control: + 1
    distributed_executor_backend: str = "mp"  # mp (processes; TCP to other hosts) | ray
    allow_cross_host_tp: bool = False        # let a TP or SP group span hosts

    def __post_init__(self):
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy, got {self.load_format!r}")
        for name in ("max_num_seqs", "block_size", "tensor_parallel_size",
                     "sequence_parallel_size", "data_parallel_size", "pipeline_parallel_size",
                     "pp_micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0: no cap), got "
                             f"{self.long_prefill_token_threshold}")
        for name in ("max_model_len", "num_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.parallel_policy not in PARALLEL_POLICIES:
            raise ValueError(f"parallel_policy must be one of {PARALLEL_POLICIES}, got "
                             f"{self.parallel_policy!r}")
        self._check_seesaw()
        self._check_swap()
        self._check_shared_ffn()
        if self.flying_preemption not in FLYING_PREEMPTIONS:
            raise ValueError(f"flying_preemption must be one of {FLYING_PREEMPTIONS}, got "
                             f"{self.flying_preemption!r}")
        if self.shift_weights not in ("reorder", "slice", "separate"):
            raise ValueError("shift_weights must be reorder, slice or separate, "
                             f"got {self.shift_weights!r}")
        if self.merge_weights not in ("reorder", "view", "materialize"):
            raise ValueError("merge_weights must be reorder, view or materialize, "
                             f"got {self.merge_weights!r}")
        if self.output_processor not in OUTPUT_PROCESSORS:
            raise ValueError(f"output_processor must be one of {OUTPUT_PROCESSORS}, got "
                             f"{self.output_processor!r}")
        if self.moe_parallel not in ("tp", "ep"):
            raise ValueError(f"moe_parallel must be tp or ep, got {self.moe_parallel!r}")
        degrees = ("tensor_parallel_size", "sequence_parallel_size", "data_parallel_size",
                   "pipeline_parallel_size")
        if self.layout is not None and any(getattr(self, name) != 1 for name in degrees):
            raise ValueError("give either layout or the parallel sizes, not both "
                             f"(layout={self.layout!r})")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError("generation_config must be auto, vllm or a folder holding "
                             f"generation_config.json, got {self.generation_config!r}")
        if not self.worker_timeout_s > 0:
            raise ValueError(f"worker_timeout_s must be > 0, got {self.worker_timeout_s}")
        if not self.worker_step_timeout_s > 0:
            raise ValueError(f"worker_step_timeout_s must be > 0, got {self.worker_step_timeout_s}")
        if not self.worker_heartbeat_timeout_s >= 1.0:  # NaN fails too
            raise ValueError("worker_heartbeat_timeout_s must be >= 1 (workers beat every "
                             f"0.2 s), got {self.worker_heartbeat_timeout_s}")
        if not (self.engine_core_process is None or isinstance(self.engine_core_process, bool)):
            raise ValueError("engine_core_process must be true, false or None (auto), got "
                             f"{self.engine_core_process!r}")
        if self.engine_core_process and self.output_processor not in ("auto", "inline"):
            raise ValueError("with engine_core_process the outputs are made in the caller's "
                             f"process: output_processor {self.output_processor!r} does not apply")
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic must be true or false, got {self.deterministic!r}")
        self._check_hosts()
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def _check_seesaw(self) -> None:
        given = [name for name in SEESAW_FIELDS if getattr(self, name) is not None]
        if not isinstance(self.seesaw_resident_weights, bool):
            raise ValueError("seesaw_resident_weights must be true or false, got "
                             f"{self.seesaw_resident_weights!r}")
        given += ["seesaw_resident_weights"] if self.seesaw_resident_weights else []
        if self.seesaw_weight_source not in SEESAW_WEIGHT_SOURCES:
            raise ValueError(f"seesaw_weight_source must be one of {SEESAW_WEIGHT_SOURCES}, "
                             f"got {self.seesaw_weight_source!r}")
        if self.seesaw_weight_source == "peers":
            given.append("seesaw_weight_source")
            if self.seesaw_resident_weights:
                raise ValueError("seesaw_weight_source='peers' re-shards weights, "
                                 "seesaw_resident_weights keeps both plans' shards resident: "
                                 "give one")
        if self.parallel_policy != "seesaw":
            if given:
                raise ValueError(f"{given[0]} is an option of the seesaw policy "
                                 "(parallel_policy='seesaw')")
        self._check_seesaw_plans()
        if self.parallel_policy != "seesaw":
            return
        if (self.cpu_kv_tokens is None) == (self.cpu_kv_gib is None):
            raise ValueError("the seesaw policy needs its CPU KV tier sized by one of "
                             "cpu_kv_tokens or cpu_kv_gib")
        if self.cpu_kv_tokens is not None and self.cpu_kv_tokens < 1:
            raise ValueError(f"cpu_kv_tokens must be >= 1, got {self.cpu_kv_tokens}")
        if self.cpu_kv_gib is not None and not self.cpu_kv_gib > 0:
            raise ValueError(f"cpu_kv_gib must be > 0, got {self.cpu_kv_gib}")
        if not self.seesaw_max_prefill_ms >= 0:
            raise ValueError("seesaw_max_prefill_ms must be >= 0 (0: unbounded), got "
                             f"{self.seesaw_max_prefill_ms}")
        others = [n for n in ("tensor_parallel_size", "sequence_parallel_size",
                              "pipeline_parallel_size") if getattr(self, n) != 1]
        if others or self.layout is not None:
            raise ValueError("under the seesaw policy prefill_plan and decode_plan give each "
                             "group's plans (data_parallel_size the groups): drop "
                             f"{others[0] if others else 'layout'}")

    def _check_swap(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got "
                             f"{self.preemption_mode!r}")
        if self.preemption_mode != "swap":
            if self.swap_space is not None:
                raise ValueError("swap_space is an option of preemption_mode='swap'")
            return
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, (int, float)) \
                or not self.swap_space > 0:
            raise ValueError("preemption_mode='swap' needs swap_space > 0 (GiB of CPU memory "
                             f"per group for the swapped KV), got {self.swap_space!r}")
        if self.parallel_policy == "seesaw":
            raise ValueError("preemption_mode='swap' does not go with the seesaw policy: its "
                             "CPU KV tier already holds every request's KV (its preempted "
                             "requests keep their slots); drop preemption_mode")

    def _check_shared_ffn(self) -> None:
        if self.parallel_policy == "sidp":
            self.share_ffn = True
        if not isinstance(self.share_ffn, bool):
            raise ValueError(f"share_ffn must be true or false, got {self.share_ffn!r}")
        if self.sidp_mode not in ("cas", "was"):
            raise ValueError(f"sidp_mode must be cas or was, got {self.sidp_mode!r}")
        for name in ("sidp_slots", "sidp_batch_threshold", "sidp_min_dwell_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.sidp_probe_file is not None and self.parallel_policy != "sidp":
            raise ValueError("sidp_probe_file is an option of the sidp policy "
                             "(parallel_policy='sidp')")
        if not self.share_ffn:
            return
        if self.data_parallel_size < 2:
            raise ValueError("shared FFN weights (SiDP) need data_parallel_size >= 2: the "
                             f"replicas share them, got {self.data_parallel_size}")
        others = [n for n in ("sequence_parallel_size", "pipeline_parallel_size")
                  if getattr(self, n) != 1]
        if others or self.layout is not None:
            raise ValueError("shared FFN weights (SiDP) are for DP replicas of plain TP: drop "
                             f"{others[0] if others else 'layout'}")
        if self.parallel_policy not in ("static", "sidp"):
            raise ValueError("shared FFN weights (SiDP) run under the static or sidp policy, "
                             f"got {self.parallel_policy}")
        if self.deterministic:
            raise ValueError("deterministic mode does not cover shared FFN weights (SiDP) yet")

    def _check_hosts(self) -> None:
        if self.distributed_executor_backend not in ("mp", "ray"):
            raise ValueError("distributed_executor_backend must be mp or ray, got "
                             f"{self.distributed_executor_backend!r}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in 0-{self.nnodes - 1} (nnodes is "
                             f"{self.nnodes}), got {self.node_rank}")
        if not 0 < self.master_port < 65535:
            raise ValueError(f"master_port must be in 1-65534, got {self.master_port}")
        if (self.nnodes > 1 or self.gpus_per_node is not None) and not self.auto_plans:
            self.topology.check_layout(self.node_layout, self.allow_cross_host_tp)

    @property
    def topology(self):
        """Which ranks share a host."""
        from parashift.parallel.topology import Topology
        return Topology.for_world(self.node_layout.world_size, self.nnodes, self.gpus_per_node)

    def _check_seesaw_plans(self) -> None:
        auto = self.auto_plans
        for name in AUTO_PLAN_FIELDS:
            value = getattr(self, name)
            if value is not None and not auto:
                raise ValueError(f"{name} is an option of prefill_plan='auto'")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.parallel_policy != "seesaw":
            return
        if auto:
            if self.decode_plan not in (None, "auto"):
                raise ValueError("prefill_plan='auto' chooses the decode plan too: omit "
                                 f"decode_plan or give 'auto', got {self.decode_plan!r}")
            return
        for name in ("prefill_plan", "decode_plan"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"the seesaw policy needs {name} (e.g. prefill_plan='pp2', "
                                 "decode_plan='tp2', or prefill_plan='auto')")
            _check_plan_name(name, getattr(self, name))

    @property
    def auto_plans(self) -> bool:
        """prefill_plan='auto': the seesaw plans are the cost model's choice, made at start-up."""
        return isinstance(self.prefill_plan, str) and AUTO_PLAN.fullmatch(self.prefill_plan) is not None

    @property
    def plan(self):
        from parashift.parallel.plan import Plan
        return Plan(dp=self.data_parallel_size, pp=self.pipeline_parallel_size,
                    sp=self.sequence_parallel_size, tp=self.tensor_parallel_size)

    @property
    def node_layout(self):
        """The node's starting layout: `layout`, or one group per DP replica of the plan."""
        from parashift.parallel.layout import Layout
        if self.parallel_policy == "seesaw":  # each group starts in its prefill plan
            if self.auto_plans:
                raise ValueError("prefill_plan='auto' is resolved at engine start-up "
                                 "(engine/seesaw_auto.py) before the layout is made")
            return Layout.parse(",".join([self.prefill_plan] * self.data_parallel_size))
        if self.share_ffn:  # each replica's FFN slices shared with the others
            return Layout.of(self.plan).sharing_ffn(self.sidp_mode)
        return Layout.parse(self.layout) if self.layout else Layout.of(self.plan)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)


def _check_plan_name(field_name: str, value: str) -> None:
    from parashift.parallel.plan import Plan
    try:
        Plan.parse(value)
    except ValueError as e:
        raise ValueError(f"{field_name} must be auto, auto:<ranks per group> (prefill_plan "
                         "only) or a plan such as pp2, pp2xtp2 or tp2, got "
                         f"{value!r} ({e})") from None
