"""Engine configuration as validated dataclasses; each design's options in its own
(parashift/designs/), nested under the design's name and given by their flat keywords."""
import functools
import os
from dataclasses import dataclass, field, fields

from parashift.designs import DESIGNS, flat_design_options, nest_design_options
from parashift.designs.flying import FlyingConfig
from parashift.designs.seesaw import SEESAW_WEIGHT_SOURCES, SeesawConfig  # noqa: F401
from parashift.designs.shift import ShiftConfig
from parashift.designs.sidp import SidpConfig
from parashift.quantization import check_kv_cache_dtype, check_quantization
from parashift.spec_decode.config import SpeculativeConfig


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # token budget of one step
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # cap on one request's tokens per step; 0 = none
    enable_chunked_prefill: bool = True  # False: a prompt's prefill runs whole in one step

    def __post_init__(self):
        minimum = {"long_prefill_token_threshold": 0}
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError("enable_chunked_prefill must be true or false, got "
                             f"{self.enable_chunked_prefill!r}")
        for f in fields(self):
            if f.name == "enable_chunked_prefill":
                continue
            value = getattr(self, f.name)
            low = minimum.get(f.name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{f.name} must be an integer >= {low}, got {value!r}")


PARALLEL_POLICIES = ("static", *DESIGNS)
PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
OUTPUT_PROCESSORS = ("auto", "thread", "inline", "process")


def _taking_flat_design_options(cls):
    """`cls(...)` takes each design's options by their flat keywords too (e.g.
    prefill_plan='pp2' is SeesawConfig's), as the CLI and `LLM(...)` give them."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self, **options):
        generated(self, **nest_design_options(options))
    cls.__init__ = __init__
    return cls


@_taking_flat_design_options
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
    # False: a prompt is prefilled whole in one step (the step budget must hold the longest)
    enable_chunked_prefill: bool = True
    max_logprobs: int = 20                   # most logprobs (sampled or prompt) a request asks; -1: no cap
    seed: int = 0
    block_size: int = 16
    num_blocks: int | None = None            # KV pool size in blocks; overrides the memory sizing
    kv_cache_memory: int | None = None       # KV pool size in bytes
    gpu_memory_utilization: float = 0.9
    attention_backend: str = "auto"          # auto | torch | torch-ref | triton | cudnn
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
    max_worker_restarts: int = 3  # replacements of a lost group per hour (0: it stays out)
    # (a worker beats every 0.2 s from a thread of its own, through long steps too: torch ops
    # release the GIL; 10 s leaves room for a kernel compile that holds it for a few seconds.
    # A worker the kernel shows stopped (SIGSTOP) is dead after 1 s of silence:
    # executor/multiproc.py's STOPPED_TIMEOUT_S.)
    parallel_policy: str = "static"          # static | shift | flying | seesaw | sidp
    # the cost model's profiles the policies decide from (parashift/cost/advisor.py): "auto"
    # (the committed ones of this GPU kind), a compute profile's JSON, or None (fixed thresholds)
    cost_profile: str | None = None
    merge_weights: str = "reorder"           # merged plans: reorder | view | materialize
    # mixture-of-experts models: tp (each expert's width split over TP) | ep (whole experts
    # split over the attention group's SP x TP ranks; vLLM's --enable-expert-parallel)
    moe_parallel: str = "tp"
    # weights: fp8 (E4M3, per-channel scales, quantized at load; an FP8 checkpoint loads as
    # it is whatever this says) | None (the checkpoint's own scheme). KV cache: auto (the
    # model's dtype) | fp8 | fp8_e4m3 (parashift/quantization/)
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    # a request preempted when the KV pool runs out: recompute (its blocks freed, computed
    # again when resumed) | swap (its KV copied to a CPU tier of swap_space GiB per group and
    # back when resumed; recompute when the tier is full). vLLM v0's names.
    preemption_mode: str = "recompute"
    swap_space: float | None = None
    # each design's options (parashift/designs/), given by their flat keywords too
    # (shift_threshold, flying_dwell_s, prefill_plan, seesaw_max_prefill_ms, share_ffn, ...)
    shift: ShiftConfig = field(default_factory=ShiftConfig)
    flying: FlyingConfig = field(default_factory=FlyingConfig)
    seesaw: SeesawConfig = field(default_factory=SeesawConfig)
    sidp: SidpConfig = field(default_factory=SidpConfig)
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
    # GIL from the loop and gained 0-5%, docs/benchmark_log.md) or in a process of their own
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
    # speculative decoding (parashift/spec_decode/): vLLM's dict or its JSON, e.g.
    # {"method": "ngram", "num_speculative_tokens": 4}; None: off
    speculative_config: SpeculativeConfig | dict | str | None = None

    def __post_init__(self):
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ("auto", "torch", "torch-ref", "triton", "cudnn"):
            raise ValueError("attention_backend must be auto, torch, torch-ref, triton or "
                             f"cudnn, got {self.attention_backend!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy, got {self.load_format!r}")
        for name in ("max_num_seqs", "block_size", "tensor_parallel_size",
                     "sequence_parallel_size", "data_parallel_size", "pipeline_parallel_size",
                     "pp_micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        self._check_prefill_and_logprobs()
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0: no cap), got "
                             f"{self.long_prefill_token_threshold}")
        for name in ("max_model_len", "num_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.cost_profile is not None and self.cost_profile != "auto" and not os.path.isfile(
                self.cost_profile):
            raise ValueError(f"cost_profile must be 'auto' or a compute profile's JSON file, got "
                             f"{self.cost_profile!r} (no such file)")
        if self.parallel_policy not in PARALLEL_POLICIES:
            raise ValueError(f"parallel_policy must be one of {PARALLEL_POLICIES}, got "
                             f"{self.parallel_policy!r}")
        self._check_swap()
        for design in DESIGNS.values():
            options = getattr(self, design.name)
            if not isinstance(options, design.options):
                raise ValueError(f"{design.name} must be a {design.options.__name__}, got "
                                 f"{options!r}")
            options.check(self)
        if self.merge_weights not in ("reorder", "view", "materialize"):
            raise ValueError("merge_weights must be reorder, view or materialize, "
                             f"got {self.merge_weights!r}")
        if self.output_processor not in OUTPUT_PROCESSORS:
            raise ValueError(f"output_processor must be one of {OUTPUT_PROCESSORS}, got "
                             f"{self.output_processor!r}")
        if self.moe_parallel not in ("tp", "ep"):
            raise ValueError(f"moe_parallel must be tp or ep, got {self.moe_parallel!r}")
        check_quantization(self.quantization)
        check_kv_cache_dtype(self.kv_cache_dtype)
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
        if not (isinstance(self.max_worker_restarts, int) and self.max_worker_restarts >= 0):
            raise ValueError("max_worker_restarts must be an integer >= 0, got "
                             f"{self.max_worker_restarts!r}")
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
        self._check_speculation()
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def _check_prefill_and_logprobs(self) -> None:
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError("enable_chunked_prefill must be true or false, got "
                             f"{self.enable_chunked_prefill!r}")
        if not self.enable_chunked_prefill and self.long_prefill_token_threshold:
            raise ValueError("long_prefill_token_threshold caps a prompt's chunk: it needs "
                             "enable_chunked_prefill")
        budget, longest = self.max_num_batched_tokens, self.max_model_len
        if not self.enable_chunked_prefill and budget and longest and budget < longest:
            raise ValueError(f"max_num_batched_tokens ({budget}) is smaller than max_model_len "
                             f"({longest}): without chunked prefill a step must hold a whole "
                             "prompt")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) \
                or self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be an integer >= -1 (-1: no cap), got "
                             f"{self.max_logprobs!r}")

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

    def _check_speculation(self) -> None:
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)

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

    @property
    def auto_plans(self) -> bool:
        """prefill_plan='auto': the seesaw plans are the cost model's choice, made at start-up."""
        return self.seesaw.auto_plans

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
            return Layout.parse(",".join([self.seesaw.prefill_plan] * self.data_parallel_size))
        if self.sidp.share_ffn:  # each replica's FFN slices shared with the others
            return Layout.of(self.plan).sharing_ffn(self.sidp.mode)
        return Layout.parse(self.layout) if self.layout else Layout.of(self.plan)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        known = set(option_defaults()) | {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)

    def as_options(self) -> dict:
        """Every option by the keyword `EngineConfig(...)`, `LLM(...)` and the CLI give it."""
        options = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in DESIGNS}
        return {**options, **flat_design_options(self)}


def option_defaults() -> dict:
    """Every option's default by its keyword (a design's by its flat keyword)."""
    return EngineConfig().as_options()
