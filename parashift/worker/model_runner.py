"""Runs the model for one step on this rank under its parallel state: builds
the step's inputs, runs this rank's part of the forward (its TP shard, its SP
slice of the tokens, its PP stage, micro-batch by micro-batch), samples on the
output rank."""
import hashlib
import logging
import time
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from parashift.attention.backend import get_backend
from parashift.context import BASE_WEIGHTS, StepContext, use_context, use_state
from parashift.deterministic.reduction import reduction_chunks
from parashift.worker.cuda_graphs import Bucket, StepGraphs
from parashift.worker.kv_swap import KVSwapper
from parashift.step.message import PLACEHOLDER_TOKEN, ChunkDelta, StepBatch
from parashift.worker.step_chunks import DecodeChunks, RequestTables, SeqChunk, sample_rows_of
from parashift.worker.prompt_logprobs import (PromptLogprobRequests, gather_rows,
                                              prompt_logprobs)
from parashift.worker.plan_resources import PlanResources, make_resources, weight_layout_of
from parashift.worker.rank_hooks import RankHooks, RankSetup, hooks_for_rank
from parashift.startup_phases import StartupPhases
from parashift.worker.step_check import StepStateCheck
from parashift.worker.step_inputs import StepInputs, build_step_inputs, counting, step_pack_bytes
from parashift.worker.token_history import TokenHistoryStore
from parashift.kv.cache import KVCache, attention_layers
from parashift.kv.cpu_tier import TierShape
from parashift.kv.views import kv_heads_per_rank, tokens_per_block, view_pool
from parashift.layers.fused_moe import FusedExperts
from parashift.layers.sampler import Sampler, position_seed
from parashift.loader.weights import load_model_weights
from parashift.layers.cpu_gemm_choice import GemmChoice
from parashift.layers.cpu_packed import pack_cpu_weights
from parashift.quantization import kv_cache_torch_dtype
from parashift.quantization.scheme import weight_quant
from parashift.models.moe import check_plan
from parashift.models.registry import model_class_for
from parashift.parallel.narrow_weights import SHIFT_MODE_NAMES, Narrowing, make_narrow_weights
from parashift.worker.profiler import RankProfiler
from parashift.parallel.shift_weights import SHIFT_WEIGHTS
from parashift.parallel.state import ParallelState
from parashift.parallel.world import world_rank
from parashift.uploads import StagingRing, current_stream

logger = logging.getLogger(__name__)
# Sampled tokens, their logprobs, the requests this step failed (id -> reason), and the
# prompt logprobs computed (worker/prompt_logprobs.py's spans, or None).
StepResult = tuple[list[int], list[dict[int, float] | None] | None, dict[str, str],
                   list | None]


class PendingStep:
    """A launched step's sampled tokens, copied to the host behind the step's
    kernels: result() waits for this step only, not for steps launched after it.
    `pinned` lends the pinned host buffer the copy lands in (taken back by result())."""

    def __init__(self, tokens: torch.Tensor | None, logprobs: list | None,
                 errors: dict[str, str] | None = None, pinned: "PinnedBuffers | None" = None,
                 prompt_logprobs: list | None = None):
        self.logprobs, self.errors, self._event = logprobs, errors or {}, None
        self.prompt_logprobs = prompt_logprobs
        self._tokens, self._buffer, self._pinned = tokens, None, pinned
        if tokens is not None and tokens.is_cuda:
            if pinned is not None and tokens.dtype == torch.int64:
                self._buffer, self._tokens = pinned.take(len(tokens))
            else:
                self._tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._tokens.copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(current_stream(tokens.device))

    def done(self) -> bool:
        return self._event is None or self._event.query()

    def result(self) -> StepResult | None:
        if self._tokens is None:
            return None
        if self._event is not None:
            self._event.synchronize()
        if not isinstance(self._tokens, list):
            self._tokens = self._tokens.tolist()
            if self._buffer is not None:  # read: the buffer may take another step's tokens
                self._pinned.give(self._buffer)
                self._buffer = None
        return self._tokens, self.logprobs, self.errors, self.prompt_logprobs


class PinnedBuffers:
    """Pinned int64 host buffers that steps' sampled tokens are copied into, reused
    (pinning a fresh one costs tens of microseconds a step), each with its views of the
    first `count` elements made once (on a step's cold caches a tensor's slicing costs
    as much as the copy)."""

    def __init__(self, size: int = 1024):
        self.size = size
        self.buffers: list[torch.Tensor] = []
        self.views: list[dict[int, torch.Tensor]] = []  # per buffer: count -> its view
        self.free: list[int] = []  # indices of buffers not lent

    def take(self, count: int) -> tuple[int, torch.Tensor]:
        """A buffer's index and its first `count` elements, lent until `give(index)`."""
        while self.free:
            index = self.free.pop()
            if len(self.buffers[index]) >= count:
                break
        else:
            index = len(self.buffers)
            self.buffers.append(torch.empty(max(count, self.size), dtype=torch.int64,
                                            pin_memory=True))
            self.views.append({})
        view = self.views[index].get(count)
        if view is None:
            view = self.views[index][count] = self.buffers[index][:count]
        return index, view

    def give(self, index: int) -> None:
        self.free.append(index)


class GroupSampling:
    """What the ranks of one group (a rank set) keep in step between their steps: the
    generator of rows without a seed, and the group's last sampled tokens (the source of
    its next step's placeholders). A rank may run steps of several groups (a merged group
    and the requests it wrote before the merge), each group in its own state."""

    def __init__(self, seed: int, device: torch.device):
        self.generator = Sampler.make_generator(seed, device)
        self.prev_tokens: torch.Tensor | None = None
        # block-table row of a request -> its index in prev_tokens (-1: sampled none)
        self.prev_index = np.full(0, -1, np.int64)

    def remember(self, tokens: torch.Tensor, rows: np.ndarray, num_rows: int) -> None:
        """This step's samples, of the requests in block-table `rows` (in order)."""
        self.prev_tokens = tokens
        if len(self.prev_index) < num_rows:
            self.prev_index = np.full(num_rows, -1, np.int64)
        else:
            self.prev_index.fill(-1)
        self.prev_index[rows] = counting(len(rows))


class ModelRunner:
    def __init__(self, config, hf_config, source, device: torch.device, dtype: torch.dtype,
                 max_model_len: int, state: ParallelState | None = None, agree_num_blocks=None,
                 other_states: tuple[ParallelState, ...] = (), group=None):
        """`state` is the base plan's (weights and KV layout); `other_states` are the
        plans a step may switch to (e.g. Shift Parallelism's shift plan); `group`: the
        GroupHandle of this rank's group where a design exchanges in it (Seesaw's weights)."""
        self.config, self.device, self.dtype = config, device, dtype
        self.state = state or ParallelState.single()
        self.block_size = config.block_size
        self.hidden_size = hf_config.hidden_size
        self.max_model_len = max_model_len
        start = time.perf_counter()
        self.phases = StartupPhases(self.state.rank)
        self.quant = weight_quant(config.quantization, hf_config)
        self.kv_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, dtype)
        with self._base_state(hf_config), self.phases.phase("model build and load"):
            self.model = self._build_model(hf_config, source, max_model_len)
        # the designs' hooks on this rank (before narrowed layouts and the KV pool): Seesaw's
        # other plan's model, SiDP's owned FFN slices shared with the peers and its slots
        with self.phases.phase("design hooks"):
            self.hooks: list[RankHooks] = hooks_for_rank(self._rank_setup(
                hf_config, source, max_model_len, other_states, group))
        self._views_per_plan = any(hook.kv_views_per_plan for hook in self.hooks)
        self.cpu_gemm = self._pack_cpu_weights(other_states)  # each CPU GEMM's route
        self.packed_weight_bytes = self.cpu_gemm.nbytes
        self.load_seconds = time.perf_counter() - start
        self.backend = get_backend(config.attention_backend, device, config.deterministic)
        self.sampler = Sampler(device, config.seed)
        self.generators: dict[str, torch.Generator] = {}  # of requests with a seed
        self.requests = RequestTables()
        self._check = StepStateCheck() if config.check_step_state else None
        self.staging = StagingRing(device)  # a step's index arrays to the device in one copy
        # room for a step of one prompt as long as a step's budget, in every slot
        tokens = config.max_num_batched_tokens
        self.staging.preallocate(step_pack_bytes(tokens, 1, -(-tokens // config.block_size)))
        self.pinned = PinnedBuffers()  # where sampled tokens land on the host
        self._profiler = None  # start_profile's (worker/profiler.py)
        if self._check is not None:
            self._check.watch_uploads(self.staging)
        self.history = TokenHistoryStore(device)  # tokens of the requests with penalties
        self.prompt_requests = PromptLogprobRequests()  # those asking for prompt logprobs
        self.swapper = KVSwapper(TierShape.of_model(hf_config, self.kv_dtype), device)  # swap preemption
        self.groups: dict[tuple[int, ...], GroupSampling] = {}  # by the ranks of a step's plan
        self._group = self._group_of(self.state.plan.ranks)  # the running step's
        self._step_masked = False  # the running step carries structured output's masks
        self._kv_views: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._bound_block_size = self.block_size
        # Narrower weight layouts (Shift, merges) before the KV pool takes what memory is left.
        with self.phases.phase("narrowed weight layouts"):
            self.shift_weight_bytes = self._make_narrow_weights(other_states, config.shift.weights)
        with self.phases.phase("KV pool (memory profile)"):
            self.kv = KVCache.for_model(self.model, config, device, self.kv_dtype,
                                        self._profile_peak_bytes,
                                        max_model_len, self.state.sp.size, agree_num_blocks)
        self.kv.bind(self.model)
        for hook in self.hooks:
            hook.report_memory(self.kv.nbytes)
        self.resources = self._make_resources([self.state, *other_states],
                                              hf_config.num_key_value_heads)
        self._report_kv_replication(hf_config.num_key_value_heads)
        with self.phases.phase("attention warm-up"):
            self._warm_up_attention()
            self.sampler.warm_up(hf_config.vocab_size, self.dtype)
            for hook in self.hooks:
                hook.bind_kv(self.kv)
        with self.phases.phase("CUDA graphs"):
            self.graphs = self._capture_graphs() if self._use_graphs(config.cuda_graphs) else None
        self.phases.report()

    def _rank_setup(self, hf_config, source, max_model_len: int,
                    other_states: tuple[ParallelState, ...], group) -> RankSetup:
        def build_model(state: ParallelState):
            with use_state(state, moe_parallel=self.config.moe_parallel, quantization=self.quant,
                           kv_fp8=self.kv_dtype != self.dtype):
                return self._build_model(hf_config, source, max_model_len)

        def reload_weights(model):
            with self._base_state(hf_config):
                load_model_weights(model, source, self.config.seed)
        return RankSetup(self.config, hf_config, source, self.device, self.dtype, max_model_len,
                         self.state, other_states, self.model, build_model, group,
                         reload_weights, self.phases)

    def _base_state(self, hf_config):
        """The context the base plan's model is built and loaded in."""
        chunks = reduction_chunks(hf_config) if self.config.deterministic else None
        return use_state(self.state, reduction_chunks=chunks,
                         moe_parallel=self.config.moe_parallel, quantization=self.quant,
                         kv_fp8=self.kv_dtype != self.dtype)

    def _pack_cpu_weights(self, other_states: tuple[ParallelState, ...]) -> GemmChoice:
        """A one-device CPU engine's GEMMs on weights packed once (layers/cpu_packed.py);
        a plan narrowing or moving weights, deterministic mode, or a node of several ranks
        (plain DP's replicas run the very GEMMs SiDP's WaS runs, bit for bit) keeps the plain
        ones; a one-device CPU engine times the routes of its GEMMs at start-up."""
        if self.device.type != "cpu" or self.config.deterministic or self.hooks \
                or other_states or self.config.node_layout.world_size != 1:
            # (the node's ranks, not the torch world's: a replaced rank's is 1)
            return GemmChoice.plain("not a one-device CPU engine outside deterministic mode")
        with self.phases.phase("CPU GEMM routes"):
            return pack_cpu_weights(self.model)

    def seesaw_move(self, verb: str, plan_name: str, moves: list, tier) -> dict:
        """A transition's move on this rank (Seesaw's: worker/seesaw.py), by the hooks of
        the design it is for; the model steps run may change with it."""
        for hook in self.hooks:
            stats = hook.move(verb, plan_name, moves, tier)
            if stats is not None:
                running = hook.running_model()
                self.model = self.model if running is None else running
                return stats
        raise ValueError("seesaw moves need --parallel-policy seesaw")

    def _model_of(self, plan) -> torch.nn.Module:
        """The model steps of `plan` run: a design's where it holds one per plan."""
        for hook in self.hooks:
            model = hook.model_for(plan.name)
            if model is not None:
                return model
        return self.model

    def _make_narrow_weights(self, states: tuple[ParallelState, ...], shift_mode: str) -> int:
        """Each (factor, position) slice of the loaded weights a plan uses, once: the shift
        plan's under `shift_mode` (--shift-weights), merged plans' under --merge-weights;
        returns the extra bytes. One permutation at load serves every reorder width that
        nests (narrow_weights.py); no merge or split moves a weight afterwards."""
        needs = {}
        for s in states:
            key = weight_layout_of(s.plan, s.rank)
            if s.plan.narrowing(s.rank) is None:
                continue
            mode = SHIFT_MODE_NAMES[shift_mode] if key == SHIFT_WEIGHTS else self.config.merge_weights
            needs[key] = Narrowing(*s.plan.narrowing(s.rank), mode)
        return make_narrow_weights(self.model, needs, report=self.state.rank == 0)

    def weights_checksum(self) -> str:
        """sha256 of every parameter's bytes, in name order (the replica a merge or split
        must leave untouched)."""
        digest = hashlib.sha256()
        for name, param in sorted(self.model.named_parameters()):
            digest.update(name.encode())
            digest.update(param.detach().cpu().flatten().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def expert_placement(self) -> list[tuple[int, int, int]]:
        """(first expert, experts held, intermediate width held) of each MoE layer here."""
        return [(m.first_expert, m.num_local, m.intermediate) for m in self.model.modules()
                if isinstance(m, FusedExperts)]

    def _make_resources(self, states: list[ParallelState], total_kv_heads: int
                        ) -> dict[str, PlanResources]:
        """Every plan's resources by name ("" is the base plan), each with its view of the
        KV pool (a merged plan's blocks hold more tokens of fewer heads)."""
        loaded = self.state.plan

        def kv_view_of(plan):
            if self._views_per_plan:  # each plan reads the pool in its own shape
                return kv_heads_per_rank(plan, total_kv_heads), self.block_size
            return (kv_heads_per_rank(plan, total_kv_heads),
                    tokens_per_block(plan, loaded, total_kv_heads, self.block_size))
        resources = make_resources(states, kv_view_of)
        resources[""] = resources[loaded.name()]
        return resources

    def _bind_kv(self, plan: PlanResources) -> None:
        """Points the attention layers at the pool as `plan` reads it (each view made once)."""
        views = self._kv_views.get(plan.block_size)
        if views is None:
            k, v = (view_pool(t, plan.block_size) for t in (self.kv.k, self.kv.v))
            views = self._kv_views[plan.block_size] = [(k[i], v[i]) for i in range(len(k))]
        for layer, (k_cache, v_cache) in zip(attention_layers(self.model), views):
            layer.k_cache, layer.v_cache = k_cache, v_cache
        self._bound_block_size = plan.block_size

    def _group_of(self, ranks: tuple[int, ...]) -> GroupSampling:
        group = self.groups.get(ranks)
        if group is None:
            group = self.groups[ranks] = GroupSampling(self.config.seed, self.device)
        return group

    def transition(self, verb: str, plan_name: str, epoch: int = 0) -> float:
        """A transition's phase on this rank; returns its seconds. `prepare` checks that
        `plan_name` was made here (its resources were made at start-up, so nothing moves);
        `commit` makes it this rank's base plan (the step message's ""). When the plan
        joins this rank with other ranks (a merge or a split), the new group's sampling
        state starts from `epoch`, as on every rank of the group. The requests this rank
        holds stay: the engine finishes them in the plans they were written in."""
        start = time.perf_counter()
        plan = self.resources.get(plan_name)
        if plan is None:
            raise ValueError(f"plan {plan_name} was not made on rank {self.state.rank} at "
                             f"start-up (made: {sorted(k for k in self.resources if k)})")
        if verb == "commit":
            if sorted(plan.plan.ranks) != sorted(self.state.plan.ranks):
                self.groups[plan.plan.ranks] = GroupSampling(self.config.seed + epoch, self.device)
            self.resources[""], self.state = plan, plan.state
        elif verb != "prepare":
            raise ValueError(f"unknown transition phase {verb!r}")
        return time.perf_counter() - start

    def _use_graphs(self, requested: bool | None) -> bool:
        """By default (None) wherever they work: CUDA, Triton attention, and every plan
        replays them (see `_graph_plans`), or a design's plans of which some do (a Seesaw
        pair: its prefill plan's stages run eagerly; SiDP: its WaS plans run eagerly, its CaS
        plans replay graphs). Not for experts in deterministic mode: they sync with the host
        on the routing. Asked for (True), the plans that can replay them do, the others run
        eagerly; False (--no-cuda-graphs): every step runs eagerly."""
        graph_plans = self._graph_plans()
        possible = (self.device.type == "cuda" and self.backend.name in ("triton", "cudnn")
                    and bool(graph_plans)
                    and not (self.config.deterministic and self.expert_placement()))
        if requested and not possible:
            raise ValueError("CUDA graphs need a CUDA device, the triton or cudnn attention "
                             "backend, "
                             "under Seesaw a decode plan of one pipeline stage, with shared "
                             "FFN weights Compute-as-a-Service (WaS's fetches are not "
                             "captured) and, in deterministic mode, no experts")
        if requested is None:
            names = {r.name for r in self.resources.values()}
            every_plan = len(graph_plans) == len(names)
            some_plans = any(hook.graphs_for_some_plans for hook in self.hooks)
            use = graphs_by_default(possible, every_plan, some_plans)
            if possible and not every_plan and self.state.rank == 0:
                logger.info(_partial_graphs_note(sorted(r.name for r in graph_plans),
                                                 sorted(names - {r.name for r in graph_plans}),
                                                 use))
            return use
        return requested

    def _graph_plans(self) -> list[PlanResources]:
        """The plans whose decode steps graphs replay: every plan, each pipeline stage its
        own layers, but those a design's hooks rule out (a Seesaw prefill plan, SiDP's WaS
        plans)."""
        return [r for r in {r.name: r for r in self.resources.values()}.values()
                if all(hook.replays_graphs(r) for hook in self.hooks)]

    def _capture_graphs(self) -> StepGraphs:
        mixed = (all(hook.mixed_step_graphs for hook in self.hooks)
                 and not self.config.deterministic and self.config.mixed_step_graphs)
        # where each plan reads its own view of the pool, bound for good, none is bound here
        bind_kv = (lambda plan: None) if self._views_per_plan else self._bind_kv
        graphs = StepGraphs(self._model_of, self.backend, self._graph_plans(), bind_kv,
                            self.max_model_len, self.config.max_num_seqs, self.device,
                            (self.hidden_size, self.dtype),
                            self._before_capture if self.hooks else None,
                            self.config.max_num_batched_tokens if mixed else 0,
                            verify_rows=self.config.speculative_config is not None)
        bind_kv(self.resources[""])
        return graphs

    def _before_capture(self, plan: PlanResources, rows: int) -> None:
        for hook in self.hooks:
            hook.before_capture(plan, rows)

    def _warm_up_attention(self) -> None:
        """Compiles the attention kernels' variants before any request can wait for them,
        for every view of the pool a plan reads. Every plan of this runner gives a rank the
        same query heads per KV head; a view of w-times larger blocks holds 1/w of them."""
        layers = attention_layers(self.model)
        if not hasattr(self.backend, "warm_up") or not layers:
            return
        for plan in {r.block_size: r for r in self.resources.values()}.values():
            self._bind_kv(plan)
            heads = layers[0].num_heads // self.state.sp.size * self.block_size // plan.block_size
            self.backend.warm_up(heads, layers[0].k_cache, layers[0].v_cache, self.dtype)
        self._bind_kv(self.resources[""])

    def _report_kv_replication(self, total_kv_heads: int) -> None:
        """With more SP x TP ranks than KV heads, each KV head is held by several ranks."""
        held, degree = self.kv.k.shape[3], self.state.plan.attn_degree
        self.kv_replication = held * degree / total_kv_heads
        if self.kv_replication > 1 and self.state.rank == 0:
            extra = self.kv.nbytes * (1 - 1 / self.kv_replication)
            logger.warning("%d KV heads over %d SPxTP ranks: each rank holds %d, so KV memory is "
                           "%.1fx an even split (%.2f GiB per rank spent on replicas)",
                           total_kv_heads, degree, held, self.kv_replication, extra / 2**30)

    def _build_model(self, hf_config, source, max_model_len: int):
        check_plan(self.state.plan, hf_config, self.config.moe_parallel)
        saved_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = model_class_for(hf_config)(hf_config, max_model_len)
        finally:
            torch.set_default_dtype(saved_dtype)
        load_model_weights(model, source, self.config.seed)
        return model.eval()

    @property
    def num_blocks(self) -> int:
        views = [hook.num_blocks for hook in self.hooks if hook.num_blocks is not None]
        return min(views, default=self.kv.num_blocks)


    # ---- one step ------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, batch: StepBatch) -> PendingStep:
        """Runs this rank's part of the step under the step's plan without waiting
        for the device. On the output rank, the result holds the sampled token of
        each sampling chunk (in order) and, when asked, their logprobs."""
        for request_id in batch.finished_request_ids:
            self.generators.pop(request_id, None)
            self.history.forget(request_id)
            self.prompt_requests.forget(request_id)
        errors = self._admit(batch.new_params)
        self.prompt_requests.admit(batch.new_params, batch.prompts)
        self._track_history(batch)
        chunks = self.requests.apply(batch)
        # structured output's masks: the ranks' parameters come without the grammar, so
        # their argmax-only flags do not see it
        self._step_masked = batch.token_masks is not None
        if self._check is not None:
            self._check.apply(batch, self.requests)
        plan = self.resources[batch.plan]
        self._swap(batch, plan)
        for hook in self.hooks:
            hook.before_step(batch, self.graphs)
        if not chunks:  # a step of swaps only, or a round of replicas with none here
            for hook in self.hooks:
                hook.step_without_tokens(batch, plan)
            return self._no_tokens(plan, errors)
        group = self._group = self._group_of(plan.plan.ranks)
        self.history.record(chunks, group.prev_tokens, group.prev_index)
        if plan.block_size != self._bound_block_size:
            self._bind_kv(plan)
        with use_context(plan.context()):
            micro_batches = split_micro_batches(chunks, plan.state.pp.size,
                                                self.config.pp_micro_batch_tokens)
            results = []
            for mb in micro_batches:
                results.append(self._run_micro_batch(mb, plan))
                if self._check is not None:  # its uploads as packed (the ring's slots
                    self._check.verify_uploads()  # cover a micro-batch, not every stage's)
            self._wait_sends()
        sampled = [mb_tokens for mb_tokens, _, _, _ in results if mb_tokens is not None]
        tokens = (sampled[0] if len(sampled) == 1 else torch.cat(sampled) if sampled
                  else torch.empty(0, dtype=torch.int64))
        sampled_rows = (results[0][2] if len(results) == 1 else
                        np.concatenate([np.empty(0, np.int64), *(r for _, _, r, _ in results)]))
        group.remember(tokens, sampled_rows, len(self.requests.lengths))
        if self._check is not None:
            self._check.remember_samples(group, chunks)
        if not plan.is_output_rank:
            return PendingStep(None, None)
        logprobs = None
        if any(mb_logprobs for _, mb_logprobs, _, _ in results):
            logprobs = []
            for mb_tokens, mb_logprobs, _, _ in results:
                count = 0 if mb_tokens is None else len(mb_tokens)
                logprobs += mb_logprobs or [None] * count
        spans = [span for *_, mb_spans in results for span in mb_spans or ()]
        return PendingStep(tokens, logprobs, errors, self.pinned, spans or None)

    def _swap(self, batch: StepBatch, plan: PlanResources) -> None:
        """The step's swaps: by a design that moves KV itself (Seesaw's stash), else by
        swap preemption."""
        for hook in self.hooks:
            if hook.take_swaps(batch, self.swapper.shape):
                return
        self.swapper.run(batch, plan, self.kv.k, self.kv.v)

    def _bucket(self, chunks: list[SeqChunk], plan: PlanResources) -> Bucket | None:
        """The graph bucket this micro-batch replays, if any (at least the rows the hooks
        ask for; none where a hook runs the step eagerly)."""
        if self.graphs is None:
            return None
        at_least = 0
        for hook in self.hooks:
            rows = hook.graph_rows()
            if rows is None:
                return None
            at_least = max(at_least, rows)
        return self.graphs.bucket_for(chunks, plan, at_least)

    @staticmethod
    def _no_tokens(plan: PlanResources, errors: dict[str, str]) -> PendingStep:
        if not plan.is_output_rank:
            return PendingStep(None, None)
        return PendingStep(torch.empty(0, dtype=torch.int64), None, errors)

    def start_profile(self, trace_dir: str | None) -> None:
        if self._profiler is None:
            self._profiler = RankProfiler(self.state.rank, self.device)
        self._profiler.start(trace_dir)

    def stop_profile(self) -> dict:
        if self._profiler is None:
            raise RuntimeError(f"rank {self.state.rank}: no profile is running (start_profile first)")
        return self._profiler.stop()

    def design_stats(self) -> dict:
        """What the designs' hooks count on this rank (SiDP's rounds)."""
        return {key: value for hook in self.hooks for key, value in hook.stats().items()}

    def design_checksums(self) -> dict:
        """The designs' checksums of what they hold (SiDP's slots)."""
        return {key: value for hook in self.hooks for key, value in hook.checksums().items()}

    shared_ffn_stats, shared_ffn_checksums = design_stats, design_checksums  # rpc names

    def _admit(self, new_params: dict) -> dict[str, str]:
        """Makes what a new request needs on this rank (its seeded generator). A request
        whose set-up fails is reported as failed; the step goes on for the others (its
        row is sampled without a seed and the engine discards the token)."""
        errors = {}
        for request_id, params in new_params.items():
            if params.seed is None:
                continue
            try:
                self.generators[request_id] = Sampler.make_generator(params.seed, self.device)
            except Exception as exc:  # noqa: BLE001 - the request's fault, not the engine's
                errors[request_id] = f"its seed could not be used ({type(exc).__name__}: {exc})"
        return errors

    def _track_history(self, batch: StepBatch) -> None:
        for request_id, params in batch.new_params.items():
            if params.uses_history:
                self.history.admit(request_id, batch.prompts[request_id])

    def _run_micro_batch(self, chunks: list[SeqChunk], plan: PlanResources):
        """Returns the sampled tokens on the device (None where nothing is sampled
        on this rank), their logprobs, the block-table rows of the chunks sampled, and the
        prompt logprobs computed (on the output rank)."""
        state = plan.state
        sp = state.sp
        prompt_rows = self.prompt_requests.rows_of(chunks)
        bucket = self._bucket(chunks, plan) if prompt_rows is None else None
        if bucket is not None:
            receive = None if state.is_first_stage else partial(self._recv_into, state)
            out, inputs = self.graphs.run(chunks, self.requests.tables, plan, bucket,
                                          self._fill_placeholders, self.staging,
                                          receive)
            if not state.is_last_stage:  # the next replay overwrites the graph's output
                out = tuple(t.clone() for t in out)
        else:
            inputs = build_step_inputs(chunks, self.requests.tables, plan.block_size,
                                       self.device, sp.size, sp.rank,
                                       staging=self.staging)
            self._fill_placeholders(inputs.token_ids, chunks, inputs)
            intermediate = None if state.is_first_stage else self._recv(inputs, state)
            with use_context(plan.context(inputs.attn, self.backend)):
                out = self.model(inputs.token_ids, inputs.positions, intermediate)
        if self._check is not None:
            self._check.verify_inputs(chunks, inputs, plan.block_size, sp.size, sp.rank,
                                      *((bucket.rows, bucket.seqs) if bucket else (0,)))
        if not state.is_last_stage:
            self._send(out, state)
            return None, None, inputs.sample_table_rows, None
        spans = None if prompt_rows is None else prompt_logprobs(
            self.model.compute_logits, out, prompt_rows, inputs.local_rows, sp,
            plan.is_output_rank)
        if not inputs.sample_rows:
            return None, None, inputs.sample_table_rows, spans
        hidden = self._sample_rows(out, inputs, sp)
        logits = self.model.compute_logits(hidden)
        if state.pp.size > 1 and not plan.is_output_rank:
            return None, None, inputs.sample_table_rows, spans
        # With one stage every rank samples (the same tokens: same logits, same seeds), so
        # every rank can fill the next step's placeholders; only the output rank reports.
        if not self._step_masked and self.requests.argmax_only[inputs.sample_table_rows].all():
            result = self.sampler.argmax(logits)
        else:
            result = self._sample(logits, sample_rows_of(chunks), plan.is_output_rank)
        return result.token_ids, result.logprobs, inputs.sample_table_rows, spans

    def _sample(self, logits: torch.Tensor, sampling: list[SeqChunk], with_logprobs: bool):
        masks = [c.token_mask for c in sampling]
        generators = ([self._generator(c, p) for c, p in zip(sampling, [None, *sampling])]
                      if self.generators else [None] * len(sampling))
        return self.sampler(logits, [c.sampling for c in sampling], generators,
                            self._group.generator, with_logprobs=with_logprobs,
                            history=self.history.batch(sampling),
                            token_masks=masks if any(m is not None for m in masks) else None)

    def _fill_placeholders(self, token_ids: torch.Tensor, chunks: list[SeqChunk],
                           inputs: StepInputs) -> None:
        """Writes the previous step's samples over this step's placeholder tokens (async
        scheduling), in the rows this rank holds."""
        local, ends = inputs.local_rows, inputs.last_rows
        rows = sources = None
        if isinstance(chunks, DecodeChunks) and not local.start and local.stop >= len(ends):
            # every row is a placeholder, and this rank holds them all
            targets, table_rows = ends, inputs.chunk_rows
        else:
            pending = inputs.last_tokens == PLACEHOLDER_TOKEN
            if local.start or (len(ends) and local.stop <= ends[-1]):  # an SP rank's rows
                pending &= (ends >= local.start) & (ends < local.stop)
            targets, table_rows = ends[pending] - local.start, inputs.chunk_rows[pending]
        if len(targets):
            origins = self._group.prev_index[table_rows]
            count, prev = len(targets), self._group.prev_tokens
            if targets[-1] != count - 1:  # rows strictly increase: the last tells them all
                rows, sources = self.staging.upload([(targets, torch.int64),
                                                     (origins, torch.int64)])
                token_ids.index_copy_(0, rows, prev.index_select(0, sources))
            elif (origins == counting(count)).all():
                # the first rows, from the first samples in order: a decode step after one
                # of the same requests (whole tensors where they are the rows: on a step's
                # cold caches each slicing costs as much as the copy)
                _first(token_ids, count).copy_(_first(prev, count))
            else:  # the first rows, from samples out of order (requests ended or joined)
                sources, = self.staging.upload([(origins, torch.int64)])
                torch.index_select(prev, 0, sources, out=_first(token_ids, count))
            if rows is None and self._check is not None:
                rows, sources = torch.arange(count), torch.as_tensor(origins)
        if self._check is not None:
            self._check.verify_placeholders(self._group, chunks, inputs, rows, sources)

    def _sample_rows(self, hidden: torch.Tensor, inputs: StepInputs, sp) -> torch.Tensor:
        """Hidden states of the sampled rows, gathered from the SP rank holding each."""
        if sp.size == 1:
            count = len(inputs.sample_rows)
            if inputs.sample_rows[-1] == count - 1:  # the first rows (rows strictly increase)
                return _first(hidden, count)
            rows, = self.staging.upload([(inputs.sample_rows, torch.int64)])
            return hidden.index_select(0, rows)  # no host sync: async scheduling overlaps
        return gather_rows(hidden, inputs.sample_rows, inputs.local_rows, sp)

    # ---- pipeline hand-off -----------------------------------------------------
    def _send(self, out: tuple[torch.Tensor, torch.Tensor], state: ParallelState) -> None:
        pp = state.pp
        peer = pp.peer(pp.rank + 1)
        self._pending_sends = getattr(self, "_pending_sends", [])
        for t in out:
            self._pending_sends.append((dist.isend(t.contiguous(), world_rank(peer)), t))

    def _recv(self, inputs: StepInputs, state: ParallelState) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (len(inputs.local_rows), self.hidden_size)
        x = torch.empty(shape, dtype=self.dtype, device=self.device)
        residual = torch.empty_like(x)
        self._recv_into(state, x, residual)
        return x, residual

    @staticmethod
    def _recv_into(state: ParallelState, x: torch.Tensor, residual: torch.Tensor) -> None:
        peer = world_rank(state.pp.peer(state.pp.rank - 1))
        dist.recv(x, peer)
        dist.recv(residual, peer)

    def _wait_sends(self) -> None:
        for work, _ in getattr(self, "_pending_sends", []):
            work.wait()
        self._pending_sends = []

    def _generator(self, chunk: SeqChunk, previous: SeqChunk | None = None
                   ) -> torch.Generator | None:
        """A seeded request's generator, seeded for the position it samples: its tokens
        depend on (seed, position) only, on every rank, across preemption and transitions.
        A verification's later positions (`previous`: the row before, of the same request)
        each take a generator of their own."""
        generator = self.generators.get(chunk.request_id)
        if generator is not None:
            if previous is not None and previous.request_id == chunk.request_id:
                generator = Sampler.make_generator(0, self.device)
            generator.manual_seed(position_seed(chunk.sampling.seed, chunk.seq_len))
        return generator

    # ---- memory profiling ----------------------------------------------------
    @torch.inference_mode()
    def _profile_peak_bytes(self, make_scratch) -> int:
        """Peak activation memory of a step of max_num_batched_tokens tokens."""
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._run_profile_step(make_scratch)
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before

    @torch.inference_mode()
    def profile_step(self) -> None:
        """The start-up profile's step run again, on every rank at once, over a scratch pool
        shaped like the KV pool (then the pool is bound again)."""
        layers, _, block_size, kv_heads, head_dim = self.kv.k.shape
        self._run_profile_step(lambda blocks: KVCache(layers, blocks, block_size, kv_heads,
                                                      head_dim, self.kv_dtype, self.device))
        self.kv.bind(self.model)

    def _run_profile_step(self, make_scratch) -> None:
        """max_num_batched_tokens dummy tokens through the model and its logits, over a
        scratch pool of `make_scratch(num_blocks)`: what every rank runs at start-up."""
        chunks, tables = profile_chunks(self.config.max_num_batched_tokens,
                                        self.max_model_len, self.block_size)
        make_scratch(int(tables.lengths.sum())).bind(self.model)
        with use_state(self.state):
            sp = self.state.sp
            inputs = build_step_inputs(chunks, tables.tables, self.block_size, self.device,
                                       sp.size, sp.rank)
            intermediate = None
            if not self.state.is_first_stage:
                x = torch.zeros(len(inputs.local_rows), self.hidden_size, dtype=self.dtype, device=self.device)
                intermediate = (x, x.clone())
            weights = weight_layout_of(self.state.plan, self.state.rank)
            for hook in self.hooks:
                hook.before_profile_step()
            with use_context(StepContext(self.state, weights, inputs.attn, self.backend)):
                out = self.model(inputs.token_ids, inputs.positions, intermediate)
            for hook in self.hooks:
                hook.after_profile_step()
            if self.state.is_last_stage:
                self.model.compute_logits(out[-min(len(out), self.config.max_num_seqs):])


def _first(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` rows of `tensor`: itself where it has no more."""
    return tensor if len(tensor) == count else tensor[:count]


def profile_chunks(num_tokens: int, max_model_len: int, block_size: int
                   ) -> tuple[list[SeqChunk], RequestTables]:
    """Dummy sequences of at most max_model_len tokens filling a step's budget,
    each on its own blocks of a scratch pool, and their block tables."""
    deltas, next_block = [], 0
    while num_tokens > 0:
        length = min(num_tokens, max_model_len)
        blocks = -(-length // block_size)
        deltas.append(ChunkDelta(f"profile-{len(deltas)}", [0] * length, 0, 0,
                                 list(range(next_block, next_block + blocks)), False))
        next_block += blocks
        num_tokens -= length
    tables = RequestTables()
    return tables.apply(StepBatch(deltas)), tables


def split_micro_batches(chunks: list[SeqChunk], stages: int,
                        min_tokens: int) -> list[list[SeqChunk]]:
    """A pipelined step's chunks as consecutive micro-batches of about equal token counts:
    one per stage at most, and none of fewer than `min_tokens` (a stage reads its weights
    once per micro-batch, so a step of decodes runs whole). A chunk across a boundary is
    cut: each stage runs its parts in order, a later part attending to the KV the earlier
    wrote, and only the last part samples."""
    if stages == 1:  # every one-stage step: no pass over its chunks
        return [chunks]
    total = sum(len(c.token_ids) for c in chunks)
    count = min(stages, total // min_tokens)
    if count <= 1:
        return [chunks]
    ends = [total * (k + 1) // count for k in range(count)]  # each micro-batch's last token
    groups, current, filled = [], [], 0
    for chunk in chunks:
        while chunk is not None:
            room = ends[len(groups)] - filled
            if len(chunk.token_ids) > room and len(groups) < count - 1:
                head, chunk = cut_chunk(chunk, room)
                current.append(head)
                filled += room
            else:
                current.append(chunk)
                filled += len(chunk.token_ids)
                chunk = None
            if filled == ends[len(groups)] and len(groups) < count - 1:
                groups.append(current)
                current = []
    groups.append(current)
    return groups


def cut_chunk(chunk: SeqChunk, size: int) -> tuple[SeqChunk, SeqChunk]:
    """The chunk's first `size` tokens and the rest; the head samples only the rows of a
    verification (speculative decoding) that fall in it."""
    tail_len = len(chunk.token_ids) - size
    in_head = max(0, chunk.num_samples - tail_len) if chunk.sampling is not None else 0
    masks = head_masks = chunk.token_mask
    if masks is not None and chunk.num_samples > 1:  # a verification's, a row per position
        head_masks, masks = masks[:max(1, in_head)], masks[in_head:]
        masks = masks if len(masks) > 1 else masks[0]
        head_masks = head_masks if in_head > 1 else head_masks[0]
    head = SeqChunk(chunk.request_id, chunk.token_ids[:size], chunk.start_pos, chunk.row,
                    chunk.sampling if in_head else None, head_masks, in_head or 1)
    tail = SeqChunk(chunk.request_id, chunk.token_ids[size:], chunk.start_pos + size, chunk.row,
                    chunk.sampling, masks, min(chunk.num_samples, tail_len))
    return head, tail


def graphs_by_default(possible: bool, every_plan: bool, some_plans: bool) -> bool:
    """Decode graphs unless asked otherwise, wherever they are possible and every plan
    replays them, or some do where a design asks (Seesaw: the decode plan; SiDP: the CaS
    plans). Measured on two H200s (docs/benchmark_log.md): Qwen3-30B-A3B's TPOT under TP=2
    was 4.7 ms with graphs and 49.3 ms eager (eleventh session); the 8B's under PP=2, 6.7 ms
    against 18.4; SiDP CaS's `tail`, 264 req/s against 40 (seventeenth session); the sidp
    policy's full-length `tail` (Qwen3-32B shape), 85.7 s with the CaS plans' graphs, not
    done in 185 s without (fortieth and thirty-ninth sessions)."""
    return possible and (every_plan or some_plans)


def _partial_graphs_note(graph_plans: list[str], eager_plans: list[str], used: bool) -> str:
    """The start-up log's line where only some plans can replay CUDA graphs."""
    if used:
        return (f"decode steps of {', '.join(graph_plans)} replay CUDA graphs; those of "
                f"{', '.join(eager_plans)} run eagerly (--no-cuda-graphs: every step eagerly)")
    return (f"decode steps run eagerly: {', '.join(eager_plans)} cannot replay CUDA graphs; "
            f"--cuda-graphs replays them for {', '.join(graph_plans)}")
