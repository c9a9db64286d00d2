"""The time of one forward step of one group under a plan: the kernels each rank runs (from
the compute profile) plus its collectives (from the link profile) plus host work, part by
part, so that a prediction that misses says which part missed.

A step's batch is its sequences, each (query tokens, context before them). Under SP the
step's tokens are split over the SP ranks (padded to a multiple); under TP every rank
computes every token with its weight shard; attention runs on all tokens for the heads a
rank holds (SP x TP splits the heads); under PP each stage runs its layers in turn, the
activations sent between stages. A DP plan's replicas step apart: the caller gives each
replica's batch (`replica_plan`)."""
import math
from dataclasses import dataclass, field

from parashift.cost.profile import ComputeProfile, LinkProfile
from parashift.cost.shape import ModelShape
from parashift.engine_switches import (FUSED_QK_NORM, FUSED_ROUTER, MIXED_GRAPH_SEQS,
                                       MIXED_GRAPH_WIDE_SEQS)
from parashift.parallel.plan import Plan

ELEMENTWISE_KERNELS = 6  # two norms, rotary with the KV write, SiLU-mul, two residual adds
QK_NORM_KERNELS = 2      # a query and a key head norm (Qwen3)
# the engine's switches (engine_switches.py): a shape's q/k norms run inside the RoPE kernel
# (outside deterministic mode), and a MoE router of up to ROUTER_FUSED_ROWS rows is one
# launch (the gate's GEMV and the routing)
ROUTER_FUSED_ROWS = 1  # kernels/moe_router.py LAYER_ROWS
# the steps that prefill which the engine's mixed graphs cover (worker/cuda_graphs.py: up to
# MIXED_GRAPH_SEQS sequences in the largest of MIXED_ROWS, and MIXED_GRAPH_WIDE_SEQS in its
# wide buckets, 0 for none); larger ones run eagerly
MIXED_GRAPH_ROWS = 2048


@dataclass(frozen=True)
class Seq:
    query: int
    context: int = 0  # tokens before this step's query tokens

    def __post_init__(self):
        if self.query < 1 or self.context < 0:
            raise ValueError(f"a step's sequence needs query >= 1 and context >= 0, got {self}")


@dataclass(frozen=True)
class StepBatch:
    seqs: tuple[Seq, ...]

    @classmethod
    def decode(cls, batch: int, context: int) -> "StepBatch":
        return cls((Seq(1, context),) * batch)

    @classmethod
    def prefill(cls, tokens: int, context: int = 0) -> "StepBatch":
        return cls((Seq(tokens, context),))

    @property
    def tokens(self) -> int:
        return sum(s.query for s in self.seqs)

    @property
    def is_decode(self) -> bool:
        return all(s.query == 1 for s in self.seqs)


@dataclass
class Breakdown:
    """Seconds of a step by part; `total` is what the step takes (wall)."""
    parts: dict = field(default_factory=dict)
    total: float = 0.0
    stage_s: float = 0.0  # how long one stage's ranks are busy with the step
    lag_s: float = 0.0    # under PP: after a stage starts the step, when the next can

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds


def replica_plan(plan: Plan) -> Plan:
    """The plan one DP replica of `plan` runs (degrees only)."""
    return Plan(pp=plan.pp, sp=plan.sp, tp=plan.tp, shift_base=plan.shift_base)


class StepModel:
    """Step times of one model on one kind of node. `graphs`: decode steps run as CUDA graphs
    (collectives at their in-graph cost, host work overlapped); `prefill_graphs`: steps that
    prefill on one-stage plans too, where the engine's mixed graphs hold them (at most
    `mixed_graph_seqs` sequences, or `wide_graph_seqs` where the engine captures wide
    buckets, and `mixed_graph_rows` tokens; larger ones run eagerly)."""

    def __init__(self, shape: ModelShape, compute: ComputeProfile,
                 link: LinkProfile | None = None, graphs: bool = True,
                 prefill_graphs: bool = False, micro_batch_tokens: int = 256,
                 mixed_graph_seqs: int = MIXED_GRAPH_SEQS,
                 mixed_graph_rows: int = MIXED_GRAPH_ROWS,
                 wide_graph_seqs: int = MIXED_GRAPH_WIDE_SEQS, deterministic: bool = False,
                 fused_qk_norm: bool = FUSED_QK_NORM, fused_router: bool = FUSED_ROUTER):
        self.shape, self.compute, self.link = shape, compute, link
        self.graphs, self.prefill_graphs = graphs, prefill_graphs
        self.micro_batch_tokens = micro_batch_tokens  # EngineConfig.pp_micro_batch_tokens
        self.mixed_graph_seqs, self.mixed_graph_rows = mixed_graph_seqs, mixed_graph_rows
        self.wide_graph_seqs = wide_graph_seqs
        self.fused_qk_norm = fused_qk_norm and not deterministic
        self.fused_router = fused_router

    def eager(self) -> "StepModel":
        """The same model with every step eager (no CUDA graphs)."""
        return StepModel(self.shape, self.compute, self.link, graphs=False,
                         micro_batch_tokens=self.micro_batch_tokens,
                         fused_qk_norm=self.fused_qk_norm, fused_router=self.fused_router)

    # ---- the step ------------------------------------------------------------------------
    def step(self, plan: Plan, batch: StepBatch) -> Breakdown:
        """One replica's step (plan's dp ignored: give each replica its own batch)."""
        if plan.world_size // plan.dp > 1 and self.link is None:
            raise ValueError(f"plan {plan.name()} needs a link profile (collectives)")
        graph = self.graphs and (batch.is_decode or self._mixed_graph(plan, batch))
        out = Breakdown()
        micro = self._micro_batches(plan, batch)
        stage = Breakdown()
        for part in micro:
            self._stage(plan, part, graph, stage)
        layers_per_stage = self.shape.num_layers / plan.pp
        for name, seconds in stage.parts.items():
            out.add(name, seconds * layers_per_stage)
        if plan.pp > 1:
            self._pipeline(plan, batch, graph, len(micro), out)
        else:
            self._head(plan, batch, graph, out)
            device = sum(out.parts.values())
            host = self.host_s(plan, batch, graph)
            self._finish(graph, device, host, out)
            out.stage_s = out.total
        return out

    def _mixed_graph(self, plan: Plan, batch: StepBatch) -> bool:
        """Whether a step that prefills replays a mixed graph (pipeline stages capture
        decode graphs only: worker/cuda_graphs.py)."""
        seqs = max(self.mixed_graph_seqs, self.wide_graph_seqs)
        return (self.prefill_graphs and plan.pp == 1 and len(batch.seqs) <= seqs
                and batch.tokens <= self.mixed_graph_rows)

    def _pipeline(self, plan: Plan, batch: StepBatch, graph: bool, micro: int,
                  out: Breakdown) -> None:
        """A pipelined step: each stage runs its layers over the step's `micro` micro-batches
        (its launches from its own rank's host, beside the other stages') and sends them on;
        the next stage starts one micro-batch later (`lag_s`), the last adds the head."""
        stage_device = sum(out.parts.values())
        send = self._collective("send_recv",
                                batch.tokens * self.shape.hidden * self.shape.dtype_bytes, 2, graph)
        out.add("send_recv", send)
        host = self._host_s(plan, graph, micro)
        busy = stage_device + send
        out.lag_s = busy / micro  # every stage's host launches at once: a later stage's
        if not graph:             # kernels wait queued for its input, not for its host
            out.parts["host_launch_excess"] = max(0.0, host - busy)
            busy = max(busy, host)
        out.stage_s = busy
        out.add("pipeline_fill", (plan.pp - 1) * out.lag_s)
        self._head(plan, batch, graph, out)
        device = sum(v for k, v in out.parts.items() if not k.startswith("host"))
        seq_host = len(batch.seqs) * self.compute.host_seq_s
        if graph:
            self._finish(graph, device, host + seq_host, out)
        else:
            out.total = max(device + out.parts["host_launch_excess"], seq_host)

    def _finish(self, graph: bool, device: float, host: float, out: Breakdown) -> None:
        overlapped = not graph or self.compute.host_overlapped
        out.total = max(device, host) if overlapped else device + host
        if overlapped:
            out.parts["host_excess" if graph else "host_launch_excess"] = max(0.0, host - device)
        else:
            out.parts["host"] = host

    def step_s(self, plan: Plan, batch: StepBatch) -> float:
        return self.step(plan, batch).total

    def lone_step_s(self, plan: Plan, batch: StepBatch) -> float:
        """A one-stage step run alone from its requests' admission to their output (nothing
        else in flight, as benchmarks/prefill_throughput.py times a prompt): a graph step's
        device time and the profile's lone host work in turn, none overlapped; an eager
        step's as `step` (the launch rate was fitted to such steps). Without a measured
        lone host term, `step`'s."""
        out = self.step(plan, batch)
        c = self.compute
        if not (c.lone_host_s or c.lone_host_token_s) or "host_launch_excess" in out.parts:
            return out.total
        device = sum(v for k, v in out.parts.items() if not k.startswith("host"))
        return device + c.lone_host_s + batch.tokens * c.lone_host_token_s

    def _micro_batches(self, plan: Plan, batch: StepBatch) -> list[StepBatch]:
        """The step's micro-batches as the model runner cuts them (split_micro_batches):
        consecutive, of about equal tokens, one per stage at most, none under
        `micro_batch_tokens` (so a step of decodes runs whole)."""
        count = min(plan.pp, batch.tokens // self.micro_batch_tokens)
        if count <= 1:
            return [batch]
        ends = [batch.tokens * (k + 1) // count for k in range(count)]
        groups, current, filled = [], [], 0
        for seq in batch.seqs:
            query, context = seq.query, seq.context
            while query:
                take = min(query, ends[len(groups)] - filled)
                current.append(Seq(take, context))
                query, context, filled = query - take, context + take, filled + take
                if filled == ends[len(groups)] and len(groups) < count - 1:
                    groups.append(StepBatch(tuple(current)))
                    current = []
        groups.append(StepBatch(tuple(current)))
        return groups

    def _stage(self, plan: Plan, batch: StepBatch, graph: bool, out: Breakdown) -> None:
        """One layer's parts for one (micro-)batch, added to `out`."""
        s, c = self.shape, self.compute
        sp, tp = plan.sp, plan.tp
        attn = sp * tp
        rows = math.ceil(batch.tokens / sp)
        b = s.dtype_bytes
        out.add("gemm", self._gemm(rows, (s.q_width + 2 * s.kv_width) // tp, s.hidden)
                + self._gemm(rows, s.hidden, s.q_width // tp))
        if s.moe:
            out.add("moe", self._moe(rows, tp))
        else:
            out.add("gemm", self.mlp_s(rows, tp))
        out.add("attention", self._attention(batch, attn))
        token_bytes = b * (8 * s.hidden + 2 * (s.q_width + 2 * s.kv_width) // attn
                           + 3 * (s.expert_intermediate * s.top_k if s.moe else s.intermediate)
                           // tp)
        out.add("elementwise", self._elementwise(rows, token_bytes, attn))
        if tp > 1:
            out.add("all_reduce", 2 * self._collective(
                "all_reduce", rows * s.hidden * b, tp, graph))
        if sp > 1:
            out.add("all_to_all", self._collective(
                "all_to_all", rows * (s.q_width + 2 * s.kv_width) // tp * b, sp, graph)
                + self._collective("all_to_all", rows * s.q_width // tp * b, sp, graph))

    def _elementwise(self, rows: int, token_bytes: float, attn: int) -> float:
        """A layer's norms, rotary, activation and adds over `rows`; a shape with head norms
        reads and writes its query and key heads once more, in two more kernels, unless they
        run inside the RoPE kernel (`fused_qk_norm`: no more launches nor bytes)."""
        s, c = self.shape, self.compute
        seconds = c.roofline_s(c.elementwise, rows * token_bytes, 0.0)
        if s.qk_norm and not self.fused_qk_norm:
            qk_bytes = 2 * s.dtype_bytes * (s.q_width + s.kv_width) // attn
            seconds += (c.elementwise.launch_s * QK_NORM_KERNELS / ELEMENTWISE_KERNELS
                        + rows * qk_bytes / (c.hbm_bytes_per_s * c.elementwise.bw_eff))
        return seconds

    def mlp_s(self, rows: int, shards: int) -> float:
        """A dense MLP's GEMMs (gate_up, down) over `rows`, its width split `shards` ways."""
        s = self.shape
        return (self._gemm(rows, 2 * s.intermediate // shards, s.hidden)
                + self._gemm(rows, s.hidden, s.intermediate // shards))

    def _gemm(self, rows: int, n: int, k: int, dense: bool = False) -> float:
        """A linear layer's GEMM (its weights FP8 where the shape's are, unless `dense`:
        the LM head and the router keep the model's dtype); one of a weight shape the
        profile timed, off its timings."""
        if not (self.shape.fp8_weights and not dense):
            timed = self.compute.gemm_timings(n, k)
            if timed:
                return self._timed_gemm(timed, rows, n, k)
        return self._roofline_gemm(rows, n, k, dense)

    def _timed_gemm(self, timed: list[tuple[int, float]], rows: int, n: int, k: int) -> float:
        """Linear in rows between the timed counts (the smallest count's time below them);
        past the largest count the roofline, less the timings' departure from it at that
        count in proportion to that count over `rows` (the two meet there; a long prompt's
        GEMMs are the roofline's)."""
        last_rows, last_s = timed[-1]
        if rows > last_rows:  # timings are of the model's dtype: its roofline, not FP8's
            departure = self._roofline_gemm(last_rows, n, k, dense=True) - last_s
            return self._roofline_gemm(rows, n, k, dense=True) - departure * last_rows / rows
        for (r0, t0), (r1, t1) in zip(timed, timed[1:]):
            if rows <= r1:
                return t0 + (t1 - t0) * max(rows - r0, 0) / (r1 - r0)
        return last_s

    def _roofline_gemm(self, rows: int, n: int, k: int, dense: bool = False) -> float:
        s, c = self.shape, self.compute
        fp8 = s.fp8_weights and not dense
        nbytes = n * k * (1 if fp8 else s.dtype_bytes) + rows * (n + k) * s.dtype_bytes
        if fp8:
            return c.fp8_gemm_s(nbytes, 2.0 * rows * n * k)
        return c.roofline_s(c.gemm, nbytes, 2.0 * rows * n * k)

    def _moe(self, rows: int, tp: int) -> float:
        """Experts split by TP (each rank a 1/tp slice of every expert): the experts the batch
        touches stream their slices; the router is a small GEMM, and the routing kernel's
        launch beside it where the engine does not fuse them (`fused_router`, at most
        ROUTER_FUSED_ROWS rows)."""
        s, c = self.shape, self.compute
        picks = rows * s.top_k
        touched = s.num_experts * (1 - (1 - 1 / s.num_experts) ** picks)
        width = s.expert_intermediate / tp
        nbytes = touched * 3 * s.hidden * width * s.dtype_bytes
        flops = 2.0 * picks * 3 * s.hidden * width
        fused = self.fused_router and rows <= ROUTER_FUSED_ROWS
        routing = 0.0 if fused else c.elementwise.launch_s / ELEMENTWISE_KERNELS
        return (c.roofline_s(c.moe, nbytes, flops)
                + self._gemm(rows, s.num_experts, s.hidden, dense=True) + routing)

    def _attention(self, batch: StepBatch, attn: int) -> float:
        s, c = self.shape, self.compute
        heads = s.num_heads / attn
        kv_heads = max(1.0, s.num_kv_heads / attn)
        b, kb, d = s.dtype_bytes, s.kv_elem_bytes, s.head_dim
        dec_bytes = dec_flops = pre_bytes = pre_flops = 0.0
        for seq in batch.seqs:
            total = seq.context + seq.query
            kv_read = total * 2 * kv_heads * d * kb
            if seq.query == 1:
                dec_bytes += kv_read + heads * d * 2 * b
                dec_flops += 4.0 * heads * d * total
            else:
                pre_bytes += kv_read + seq.query * heads * d * 2 * b
                pre_flops += 4.0 * heads * d * seq.query * (seq.context + seq.query / 2)
        seconds = 0.0
        if dec_bytes:
            seconds += c.roofline_s(c.decode_attention, dec_bytes, dec_flops)
        if pre_bytes:
            seconds += c.roofline_s(c.prefill_attention, pre_bytes, pre_flops)
        return seconds

    def _head(self, plan: Plan, batch: StepBatch, graph: bool, out: Breakdown) -> None:
        """The LM head over the sampled rows (vocabulary split over SP x TP), its gather, and
        the sampler."""
        s, c = self.shape, self.compute
        rows = len(batch.seqs)
        shards = plan.sp * plan.tp
        out.add("lm_head", self._gemm(rows, s.vocab // shards, s.hidden, dense=True))
        if shards > 1:
            out.add("all_gather", self._collective(
                "all_gather", rows * s.vocab // shards * 4, shards, graph))
        out.add("sampler", c.sampler_s + rows * c.sampler_row_s)

    def _collective(self, name: str, nbytes: float, ranks: int, graph: bool) -> float:
        if ranks <= 1:
            return 0.0
        return self.link.seconds(name, nbytes, ranks, graph)

    def host_s(self, plan: Plan, batch: StepBatch, graph: bool) -> float:
        """A one-stage step's host work: its launches (a graph's replay) and its sequences'."""
        return self._host_s(plan, graph, 1) + len(batch.seqs) * self.compute.host_seq_s

    def _host_s(self, plan: Plan, graph: bool, micro: int) -> float:
        c = self.compute
        if graph:
            return c.host_step_s
        per_layer = (c.kernels_per_layer + (c.sp_kernels_per_layer if plan.sp > 1 else 0)
                     + (c.tp_kernels_per_layer if plan.tp > 1 else 0)
                     + (c.moe_kernels_per_layer if self.shape.moe else 0))
        kernels = per_layer * self.shape.num_layers / plan.pp * micro + 10
        return kernels * c.eager_launch_s  # a stage's: each stage's rank launches its own

    # ---- memory ----------------------------------------------------------------------
    def weight_bytes_per_rank(self, plan: Plan, extra_shift_copy: bool = False,
                              ffn_owners: int = 1, ffn_slots: int = 0) -> float:
        """`ffn_owners`: SiDP replicas sharing the FFN weights (each holds 1/owners of every
        layer's), with `ffn_slots` layers' worth of slots for fetched slices."""
        s = self.shape
        mlp = s.mlp_params * (s.num_layers / ffn_owners + ffn_slots * (ffn_owners - 1) / ffn_owners)
        layers = (s.num_layers * s.attention_params + mlp) / (plan.tp * plan.pp)
        embeddings = s.embedding_params / (plan.sp * plan.tp)
        held = layers * s.linear_bytes + embeddings * s.dtype_bytes
        if extra_shift_copy and plan.sp > 1:
            held += s.num_layers * s.layer_bytes / (plan.sp * plan.tp * plan.pp)
        return held

    def kv_tokens(self, plan: Plan, extra_shift_copy: bool = False, ffn_owners: int = 1,
                  ffn_slots: int = 0) -> int:
        """KV tokens the node holds under `plan`: each replica's pool (its ranks hold the same
        tokens, different heads or layers), times the replicas."""
        s, c = self.shape, self.compute
        free = (c.memory_bytes * c.memory_utilization - c.activation_bytes
                - self.weight_bytes_per_rank(plan, extra_shift_copy, ffn_owners, ffn_slots))
        kv_heads = max(1.0, s.num_kv_heads / (plan.sp * plan.tp))
        per_token = 2 * (s.num_layers / plan.pp) * kv_heads * s.head_dim * s.kv_elem_bytes
        if free <= 0:
            return 0
        return plan.dp * int(free // per_token)
