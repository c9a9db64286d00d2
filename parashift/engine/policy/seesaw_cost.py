"""Seesaw's plan-pair choice (`--prefill-plan auto`): the roofline of the paper's appendix A
(arXiv 2503.06433, Eq. 1 over Table 3's per-layer costs) scores every static plan of a
group's ranks and every (prefill, decode) pair the seesaw policy can switch between, the
pair paying its transitions; a pair is chosen only where it beats the best static plan.

Per layer, for a global batch of b sequences of s tokens (Table 3):
  weights read  2W/B_HBM                 linear FLOPs  2·W·tokens
  attention     prefill reads Q, K, V; decode reads the KV of s tokens
  attention FLOPs  prefill 2·b·hq·s²·d (causal QKᵀ and PV); decode 4·b·hq·s·d
                (the paper's b·hq·s²·d² is a typo: FLOPs are linear in d)
  all-reduce    two per layer of tokens·hidden values over B_ar(TP)
  1/throughput = (L/b)·[max(T_dm^lin/TP, T_c^lin/(DP·TP·PP)) + max(T_dm^attn, T_c^attn)/(DP·TP·PP)
                        + T_nw(TP)/(PP·DP)]                                        (Eq. 1)
The maximum decode batch is A.3's b_max: each rank's memory less its weight shard, over
its KV per sequence. Prefill and decode are scored apart and added (one request's prompt
once, then its output tokens one step each); pipeline stages are taken as full (no
bubbles) and PP's point-to-point traffic is added at the peer rate. The LM head and the
embedding count in memory, not in time. Dense models only: a mixture of experts is refused.

A transition (one direction) costs each rank's weight-shard bytes it does not already hold
over the host->device rate (on two H200s, 8B shape: 3.5 GB at ~50 GB/s, 0.07 s, as the peer
re-shard measured 0.06-0.07 s; host copies alone rewrite the whole shard, 0.15 s); the
prefilled KV crosses the CPU tier twice (out of the prefill plan, into the decode plan) at
the tier's rate, every rank its share. The tier bounds how many prompts one prefill phase
holds, hence the transitions per request and the decode batch.

Measured on 2 H100s over NVLink (Llama-3.1-8B shape, 128 requests of 2000-4000 prompt and
100-300 output tokens): TP=2 9.9 s, DP=2 9.1 s, PP=2 33.3 s, seesaw PP2->TP2 80.5 s with the
KV moved at ~2.4 GB/s through an unpinned tier. On such links the choice is a static plan."""
import math
from dataclasses import dataclass, field, replace

from parashift.cost.switch import missing_weight_bytes
from parashift.parallel.plan import Plan

PER_REQUEST = None  # Workload.num_requests for steady state: costs per request


@dataclass(frozen=True)
class Hardware:
    """One device's rates (bytes/s, FLOP/s) and the links between devices and to the host."""
    hbm_bytes_per_s: float
    matmul_flops: float
    memory_bytes: float                  # what the engine may use on one device
    all_reduce_bus_bytes_per_s: float    # NCCL's bus bandwidth: B_ar(2)
    host_to_device_bytes_per_s: float    # weight shards re-loaded at a transition
    kv_tier_bytes_per_s: float           # KV between the device and the CPU tier
    peer_bytes_per_s: float              # PP's activations between stages
    link: str = "unknown"                # nvlink | pcie | host | cpu (where the numbers came from)

    def __post_init__(self):
        for f in ("hbm_bytes_per_s", "matmul_flops", "memory_bytes", "all_reduce_bus_bytes_per_s",
                  "host_to_device_bytes_per_s", "kv_tier_bytes_per_s", "peer_bytes_per_s"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"hardware {f} must be a number > 0, got {value!r}")

    @classmethod
    def from_profiles(cls, compute, link) -> "Hardware":
        """The rates of a compute and a link profile (cost/profile.py): the copy and matrix
        rates at the GEMMs' fitted efficiencies, NCCL's bus bandwidth at 64 MiB, the peer
        rate of a 1 GiB copy."""
        size = 64 * 2 ** 20
        ring = 2 * (link.ranks - 1) / link.ranks
        bus = ring * size / link.seconds("all_reduce", size, link.ranks, graph=False)
        return cls(compute.hbm_bytes_per_s * compute.gemm.bw_eff,
                   compute.matmul_flops * compute.gemm.flops_eff,
                   compute.memory_bytes * compute.memory_utilization - compute.activation_bytes,
                   bus, link.host_to_device_bytes_per_s, link.kv_tier_bytes_per_s,
                   2 ** 30 / link.seconds("peer_copy", 2 ** 30, 2), link.link)

    def all_reduce_bytes_per_s(self, tp: int) -> float:
        """B_ar(TP) of a ring all-reduce: falls as TP grows (2(TP-1)/TP of the data per link)."""
        return self.all_reduce_bus_bytes_per_s * tp / (2 * (tp - 1))


MOE_ATTRIBUTES = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    weight_dtype_bytes: int = 0   # the linear layers' weights (1: FP8); 0: dtype_bytes
    kv_dtype_bytes: int = 0       # the KV cache's (1: FP8); 0: dtype_bytes

    def __post_init__(self):
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate", "vocab", "dtype_bytes"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"model shape {f} must be an integer >= 1, got {getattr(self, f)!r}")

    @classmethod
    def of_hf(cls, hf_config, dtype_bytes: int = 2, weight_dtype_bytes: int = 0,
              kv_dtype_bytes: int = 0) -> "ModelShape":
        experts = [a for a in MOE_ATTRIBUTES if (getattr(hf_config, a, 0) or 0) > 0]
        if experts:
            raise ValueError("the seesaw cost model (prefill_plan='auto') covers dense models; "
                             f"this one has experts ({experts[0]}): name the plans")
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        return cls(hf_config.num_hidden_layers, hf_config.hidden_size,
                   hf_config.num_attention_heads, hf_config.num_key_value_heads, head_dim,
                   hf_config.intermediate_size, hf_config.vocab_size, dtype_bytes,
                   bool(getattr(hf_config, "tie_word_embeddings", False)),
                   weight_dtype_bytes, kv_dtype_bytes)

    @property
    def layer_params(self) -> int:
        """W: Q and O projections, K and V, gate, up and down."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate

    @property
    def layer_bytes(self) -> int:
        return self.layer_params * (self.weight_dtype_bytes or self.dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.num_layers * self.layer_bytes + embeddings * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * (
            self.kv_dtype_bytes or self.dtype_bytes)

    def check(self, plan: Plan) -> None:
        """The engine's own start-up check of the split (heads, KV heads, layers, MLP)."""
        plan.check_model(self.num_heads, self.num_kv_heads, self.num_layers, self.intermediate)


@dataclass(frozen=True)
class Workload:
    prompt_tokens: float
    output_tokens: float
    num_requests: int | None = PER_REQUEST  # None: steady state (seconds per request)
    max_num_seqs: int = 256                 # sequences one replica decodes at once
    step_tokens: int = 8192                 # one replica's prefill tokens per step
    tier_tokens: int | None = None          # the CPU KV tier per group; None: unbounded

    def __post_init__(self):
        if not (self.prompt_tokens >= 1 and self.output_tokens >= 1):
            raise ValueError("workload prompt_tokens and output_tokens must be >= 1, got "
                             f"{self.prompt_tokens} and {self.output_tokens}")
        for f in ("num_requests", "tier_tokens"):
            value = getattr(self, f)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"workload {f} must be an integer >= 1 or None, got {value!r}")
        if self.max_num_seqs < 1 or self.step_tokens < 1:
            raise ValueError("workload max_num_seqs and step_tokens must be >= 1")

    @property
    def requests(self) -> int:
        return self.num_requests or 1

    @property
    def decode_context(self) -> float:
        """A decoding sequence's mean length over its output."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True)
class Score:
    prefill: Plan
    decode: Plan
    prefill_s: float
    decode_s: float
    transition_s: float = 0.0
    transitions: float = 0.0

    @property
    def static(self) -> bool:
        return self.prefill == self.decode

    @property
    def name(self) -> str:
        return self.prefill.name() if self.static else f"{self.prefill.name()}->{self.decode.name()}"

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s + self.transition_s

    def row(self) -> str:
        return (f"{self.name:>14} {self.total_s:10.4g} s  prefill {self.prefill_s:.4g}  decode "
                f"{self.decode_s:.4g}  transitions {self.transitions:.3g} ({self.transition_s:.4g} s)")


@dataclass(frozen=True)
class Choice:
    best: Score
    table: tuple[Score, ...]                 # feasible candidates, fastest first
    refused: dict[str, str] = field(default_factory=dict)  # candidate -> why not

    def report(self) -> str:
        lines = [score.row() for score in self.table]
        lines += [f"{name:>14} refused: {why}" for name, why in self.refused.items()]
        return "\n".join(lines)


# ---- Eq. 1 ---------------------------------------------------------------------------
def seconds_per_sequence(shape: ModelShape, hw: Hardware, plan: Plan, batch: float,
                         seq_tokens: float, prefill: bool) -> float:
    """Eq. 1's 1/throughput: seconds per sequence of one prefill, or of one decode step."""
    d, hq, hkv, w = shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.layer_params
    tokens = batch * seq_tokens if prefill else batch
    weights_s = shape.layer_bytes / hw.hbm_bytes_per_s
    linear_s = 2 * w * tokens / hw.matmul_flops
    if prefill:
        attn_bytes = shape.dtype_bytes * batch * seq_tokens * (hq + 2 * hkv) * d
        attn_flops = 2 * batch * hq * seq_tokens ** 2 * d
    else:
        attn_bytes = 2 * (shape.kv_dtype_bytes or shape.dtype_bytes) * batch * seq_tokens * hkv * d
        attn_flops = 4 * batch * hq * seq_tokens * d
    attn_s = max(attn_bytes / hw.hbm_bytes_per_s, attn_flops / hw.matmul_flops)
    network_s = 0.0
    if plan.tp > 1:
        network_s = 2 * shape.dtype_bytes * tokens * shape.hidden / hw.all_reduce_bytes_per_s(plan.tp)
    ranks = plan.dp * plan.tp * plan.pp
    layer_s = (max(weights_s / plan.tp, linear_s / ranks) + attn_s / ranks
               + network_s / (plan.pp * plan.dp))
    peer_s = (plan.pp - 1) * shape.dtype_bytes * tokens * shape.hidden / hw.peer_bytes_per_s
    return (shape.num_layers * layer_s + peer_s / plan.dp) / batch


def max_decode_batch(shape: ModelShape, hw: Hardware, plan: Plan, seq_tokens: float) -> int:
    """A.3's b_max: sequences of `seq_tokens` whose KV fits beside each rank's weights."""
    free = hw.memory_bytes - shape.weight_bytes / (plan.tp * plan.pp)
    heads_per_rank = max(shape.num_kv_heads / plan.tp, 1)
    token_bytes = shape.kv_bytes_per_token / (plan.pp * shape.num_kv_heads) * heads_per_rank
    return plan.dp * max(0, math.floor(free / (token_bytes * seq_tokens)))


def prefill_seconds(shape: ModelShape, hw: Hardware, plan: Plan, load: Workload) -> float:
    per_step = max(1, load.step_tokens // math.ceil(load.prompt_tokens))
    batch = plan.dp * plan.pp * per_step  # every replica and stage busy
    return load.requests * seconds_per_sequence(shape, hw, plan, batch, load.prompt_tokens, True)


def decode_seconds(shape: ModelShape, hw: Hardware, plan: Plan, load: Workload,
                   most: int | None = None) -> float:
    """The output tokens at the largest batch memory, the engine and `most` allow."""
    batch = min(max_decode_batch(shape, hw, plan, load.decode_context),
                plan.dp * load.max_num_seqs, load.num_requests or math.inf, most or math.inf)
    if batch < 1:
        raise ValueError(f"{plan.name()} leaves no memory for one sequence's KV")
    step_s = seconds_per_sequence(shape, hw, plan, batch, load.decode_context, False)
    return load.requests * load.output_tokens * step_s


# ---- transitions ---------------------------------------------------------------------
def transitions_per_run(load: Workload, prompts_per_phase: int) -> float:
    """Two per prefill phase, less the last one's return (steady state: per request)."""
    if load.num_requests is None:
        return 2 / prompts_per_phase
    return 2 * math.ceil(load.num_requests / prompts_per_phase) - 1


def pair_score(shape: ModelShape, hw: Hardware, prefill: Plan, decode: Plan,
               load: Workload, resident_weights: bool = False) -> Score:
    """With `resident_weights` each rank holds both plans' shards: no weight copies, and
    each plan's KV has the memory less the other plan's shard too."""
    prompt = math.ceil(load.prompt_tokens)
    tier_prompts = math.inf if load.tier_tokens is None else load.tier_tokens // prompt
    if tier_prompts < 1:
        raise ValueError(f"the CPU KV tier ({load.tier_tokens} tokens) holds no prompt of {prompt}")
    per_phase = min(tier_prompts, load.num_requests or math.inf)
    # steady state with an unbounded tier: one phase for ever, no transition per request
    transitions = 0.0 if per_phase == math.inf else transitions_per_run(load, int(per_phase))
    weights_s = (missing_weight_bytes(shape, prefill, decode)
                 + missing_weight_bytes(shape, decode, prefill)) / 2 / hw.host_to_device_bytes_per_s
    if resident_weights:
        weights_s = 0.0
        other = shape.weight_bytes / (prefill.tp * prefill.pp)
        hw = replace(hw, memory_bytes=max(1.0, hw.memory_bytes - other))
    kv_s = (2 * load.requests * load.prompt_tokens * shape.kv_bytes_per_token
            / (hw.kv_tier_bytes_per_s * prefill.world_size))
    most = None if per_phase == math.inf else int(per_phase)  # a phase decodes what it prefilled
    return Score(prefill, decode, prefill_seconds(shape, hw, prefill, load),
                 decode_seconds(shape, hw, decode, load, most),
                 transitions * weights_s + kv_s, transitions)


def static_score(shape: ModelShape, hw: Hardware, plan: Plan, load: Workload) -> Score:
    return Score(plan, plan, prefill_seconds(shape, hw, plan, load),
                 decode_seconds(shape, hw, plan, load))


# ---- candidates ----------------------------------------------------------------------
def _factorizations(world_size: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(world_size,)]
    return [(d, *rest) for d in range(1, world_size + 1) if world_size % d == 0
            for rest in _factorizations(world_size // d, parts - 1)]


def static_plans(world_size: int) -> list[Plan]:
    """Every DP x PP x TP plan of the ranks (SP is not in the paper's model)."""
    return [Plan(dp=dp, pp=pp, tp=tp) for dp, pp, tp in _factorizations(world_size, 3)]


def seesaw_pairs(world_size: int) -> list[tuple[Plan, Plan]]:
    """(PP x TP with PP > 1, another PP x TP) over the same ranks: what seesaw_plans takes."""
    plans = [Plan(pp=pp, tp=tp) for pp, tp in _factorizations(world_size, 2)]
    return [(p, d) for p in plans if p.pp > 1 for d in plans if d != p]


# A pair is chosen only where the model puts it this much faster than the best static plan.
# Measured, the pairs ran 10-25% slower than predicted against the static plans: on two
# H100s, chat PP2->TP2 predicted 0.96x TP2, ran 0.86x, and summarize predicted 0.86x DP2,
# ran 0.65x; on four H200s, chat PP4->TP4 predicted 1.01x TP4, ran 0.86x
# (docs/benchmark_log.md, tenth and fourteenth sessions).
PAIR_MARGIN = 0.10


def choose_plans(shape: ModelShape, hw: Hardware, load: Workload, world_size: int,
                 resident_weights: bool = False) -> Choice:
    """Every candidate scored, fastest first; the best pair only where it beats every
    static plan by PAIR_MARGIN (ties go to the static plan, and among those to fewer
    pipeline stages). `resident_weights`: the pairs keep both shards on the device (no
    weight copies)."""
    scores, refused = [], {}
    candidates = [(p, p) for p in static_plans(world_size)] + seesaw_pairs(world_size)
    for prefill, decode in candidates:
        name = prefill.name() if prefill == decode else f"{prefill.name()}->{decode.name()}"
        try:
            shape.check(prefill)
            shape.check(decode)
            scores.append(static_score(shape, hw, prefill, load) if prefill == decode
                          else pair_score(shape, hw, prefill, decode, load, resident_weights))
        except ValueError as e:
            refused[name] = str(e)
    if not any(s.static for s in scores):
        raise ValueError(f"no plan of {world_size} ranks fits this model: {refused}")
    table = tuple(sorted(scores, key=lambda s: (s.total_s, not s.static, s.prefill.pp,
                                                s.decode.pp)))
    static = next(s for s in table if s.static)
    best = table[0] if table[0].total_s < (1 - PAIR_MARGIN) * static.total_s else static
    return Choice(best, table, refused)
