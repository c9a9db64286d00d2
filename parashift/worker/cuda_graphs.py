"""CUDA graphs for steps, one per (plan, bucket).

A pure-decode step of B sequences runs as the graph of the smallest decode bucket >= B,
padded (see build_step_inputs). A step that prefills (alone or beside decodes) of at most
MIXED_SEQS sequences and R <= the largest MIXED_ROWS token rows runs as the graph of the
smallest mixed bucket >= R, its sequences padded to MIXED_SEQS (opt-in wide buckets of at
least WIDE_MIN_ROWS rows hold up to WIDE_SEQS sequences): its attention is one
launch in the prefill configuration over a grid fixed by the bucket. Mixed graphs take a
short prefill's host launches (hundreds a step, longer than the kernels below ~2,048 rows
at four ranks) off the critical path; single-stage plans only, not in deterministic mode,
nor with shared FFN weights or Seesaw. The bucket is a function of the step message
alone, so every rank of a replica replays the same graph and the collectives
inside stay matched. A pipelined plan's graph holds its stage's layers: a later
stage receives the previous one's hidden states into static buffers before the
replay, and the send and receive stay outside the graphs. Attention metadata is
read from static buffers that each step refills; the split-KV grid was fixed at
capture for max_model_len, which stays correct for any shorter context. On by
default on CUDA (`--enforce-eager` turns them off); tests/engine/test_gpu_engine.py
checks them against eager."""
from dataclasses import dataclass
from operator import attrgetter

import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.uploads import pack_offsets
from parashift.worker.step_chunks import DecodeChunks, SeqChunk
from parashift.worker.step_inputs import StepInputs, build_step_inputs
from parashift.context import use_context
from parashift.engine_switches import MIXED_GRAPH_SEQS, MIXED_GRAPH_WIDE_SEQS

_TOKENS = attrgetter("token_ids")
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MIXED_ROWS = (256, 512, 1024, 2048)  # token rows of the graphs of steps that prefill
# the sequences such a graph holds: its decodes attend in the prefill configuration (more
# compute per decode than eager's own launch), so a step of more runs eagerly (a tuning
# knob, not an option: on four H200s eager TP4 steps are host-bound near 50 ms)
MIXED_SEQS = MIXED_GRAPH_SEQS
# wide mixed buckets beside those (0: none): graphs of WIDE_MIN_ROWS rows and more holding
# up to this many sequences, for a prompt chunk admitted beside a full batch of decodes
# (TP=2 offline chat: 264 such steps of 1,917 ran eagerly); a step of at most MIXED_SEQS
# sequences still takes the narrower bucket of its rows
WIDE_SEQS = MIXED_GRAPH_WIDE_SEQS
WIDE_MIN_ROWS = 512
# With speculative decoding, smaller mixed buckets for verification steps (k + 1 rows a
# sequence, at least 2): padded to 256 rows, a batch-1 verification of the 8B shape on an
# H200 took 8.1 ms against a 5.0 ms decode (2026-11-29)
VERIFY_ROWS = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Bucket:
    """A graph's padded shape: token rows and sequences (equal for decode)."""
    rows: int
    seqs: int

    @property
    def decode(self) -> bool:
        return self.rows == self.seqs


class GraphSizes:
    """The buckets a runner captures, and the one a step replays."""

    def __init__(self, max_num_seqs: int, sp_sizes: set[int], max_mixed_rows: int = 0,
                 verify_rows: bool = False):
        if MIXED_SEQS < 1:
            raise ValueError(f"PARASHIFT_MIXED_GRAPH_SEQS must be at least 1, got {MIXED_SEQS}")
        self.decode = [b for b in DEFAULT_BUCKETS if b <= max_num_seqs
                       and all(b % sp == 0 for sp in sp_sizes)]
        if WIDE_SEQS < 0:
            raise ValueError(f"PARASHIFT_MIXED_GRAPH_WIDE_SEQS must be at least 0, got {WIDE_SEQS}")
        self.mixed_seqs = min(MIXED_SEQS, max_num_seqs)
        self.mixed_rows = [r for r in MIXED_ROWS if self.mixed_seqs < r <= max_mixed_rows
                           and all(r % sp == 0 for sp in sp_sizes)]
        wide_seqs = min(WIDE_SEQS, max_num_seqs)
        self.wide_seqs = wide_seqs if wide_seqs > self.mixed_seqs else 0
        wide = [Bucket(r, self.wide_seqs) for r in self.mixed_rows
                if self.wide_seqs and r >= WIDE_MIN_ROWS and r > self.wide_seqs]
        small = [r for r in VERIFY_ROWS if verify_rows and r <= max_mixed_rows
                 and all(r % sp == 0 for sp in sp_sizes)]
        # smallest first: (rows, sequences) of every mixed graph; for_step takes the first
        # that holds a step, so the narrow bucket of a row count before its wide one
        self.mixed = sorted({Bucket(r, min(self.mixed_seqs, r // 2)) for r in small}
                            | {Bucket(r, self.mixed_seqs) for r in self.mixed_rows} | set(wide),
                            key=lambda b: (b.rows, b.seqs))

    @property
    def most_mixed_seqs(self) -> int:
        """The most sequences a mixed graph holds."""
        return max(self.mixed_seqs, self.wide_seqs)

    def captured(self, single_stage: bool) -> list[Bucket]:
        """A plan's buckets, largest first (mixed ones for a plan of one stage)."""
        mixed = reversed(self.mixed) if single_stage else ()
        return [*mixed, *(Bucket(b, b) for b in reversed(self.decode))]

    def decode_rows(self, rows: int) -> int | None:
        """The decode bucket of `rows` sequences."""
        return next((b for b in self.decode if b >= rows), None)

    def for_step(self, rows: int, seqs: int, at_least: int = 0) -> Bucket | None:
        """The bucket of a step of `rows` token rows over `seqs` sequences (a decode step's
        padded to `at_least` rows: a shared-FFN round's), or None where none fits."""
        if rows == seqs:
            size = self.decode_rows(max(rows, at_least))
            return None if size is None else Bucket(size, size)
        if at_least:
            return None
        return next((b for b in self.mixed if b.rows >= rows and b.seqs >= seqs), None)


def input_layout(bucket: Bucket, sp_size: int) -> list[tuple[int, int, torch.dtype]]:
    """(byte offset, length, dtype) of a graph's tokens and positions (an SP rank's rows),
    slots, query starts and sequence lengths in the pack of a step padded to `bucket`
    (build_step_inputs' arrays in its order, packed by StagingRing.reserve)."""
    local = bucket.rows // sp_size
    shapes = [(local, torch.int64), (local, torch.int64), (bucket.rows, torch.int64),
              (bucket.seqs + 1, torch.int32), (bucket.seqs, torch.int32)]
    offsets, _ = pack_offsets([n * dtype.itemsize for n, dtype in shapes])
    return [(start, n, dtype) for start, (n, dtype) in zip(offsets, shapes)]


class StepGraphs:
    def __init__(self, model_for, backend, plans: list, bind_kv, max_model_len: int,
                 max_num_seqs: int, device: torch.device,
                 hidden: tuple[int, torch.dtype] | None = None, before_capture=None,
                 max_mixed_rows: int = 0, verify_rows: bool = False):
        """`plans`: the PlanResources of every plan whose decode steps replay graphs;
        `model_for(plan)` the model a plan's steps run (one for every plan, except under
        Seesaw: one per plan); `bind_kv(plan)` points it at the KV pool as that plan reads
        it (each graph captures its plan's view); `hidden`: the hidden size and dtype of
        the states a later pipeline stage receives (needed only with such a stage);
        `before_capture(plan, bucket)` readies what the capture needs (shared FFN weights'
        exchanges padded to the bucket); `max_mixed_rows`: the most token rows of a step that
        prefills (the step budget), 0 for no mixed graphs; single-stage plans capture them;
        `verify_rows`: smaller mixed graphs for speculative decoding's verification steps."""
        self.before_capture = before_capture
        self.model_for, self.backend, self.bind_kv = model_for, backend, bind_kv
        self.max_model_len = max_model_len
        self.sizes = GraphSizes(max_num_seqs, {p.state.sp.size for p in plans}, max_mixed_rows,
                                verify_rows)
        largest = self.sizes.decode[-1]
        rows = max([largest, *(b.rows for b in self.sizes.mixed)])
        seqs = max(largest, self.sizes.most_mixed_seqs)
        max_blocks = -(-max_model_len // min(p.block_size for p in plans))
        # Every graph's inputs but its block tables are views of this buffer, where a step's
        # pack lands in one copy (StagingRing.reserve(into=)): where each view starts is a
        # function of the plan's SP size and the bucket (`_inputs`), as in the pack of a
        # step padded to the bucket. The pack's block tables (last) are copied from it.
        self.packed = torch.zeros(pack_offsets([rows * 8] * 3 + [(seqs + 1) * 4, seqs * 4,
                                                seqs * max_blocks * 4])[1],
                                  dtype=torch.uint8, device=device)
        self._views: dict[tuple[int, Bucket], list[torch.Tensor]] = {}
        self.tables = torch.zeros(seqs, max_blocks, dtype=torch.int32, device=device)
        # (bucket sequences, a step's table width) -> the part of `tables` it fills
        self._table_views: dict[tuple[int, int], torch.Tensor] = {}
        self.received = None  # a later pipeline stage's (hidden states, residual)
        if any(not p.state.is_first_stage for p in plans):
            size, dtype = hidden
            self.received = tuple(torch.zeros(largest, size, dtype=dtype, device=device)
                                  for _ in range(2))
        self.graphs: dict[tuple[str, Bucket], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        for plan in sorted(plans, key=lambda p: p.graph_key):  # same order on every rank
            for bucket in self.sizes.captured(plan.state.pp.size == 1):
                self.graphs[(plan.graph_key, bucket)] = self._capture(plan, bucket)

    def bucket_for(self, chunks: list[SeqChunk], plan, at_least: int = 0) -> Bucket | None:
        """The graph bucket of a step of `chunks` (a decode step's padded to `at_least` rows:
        a shared-FFN round's), or None where this plan captured none."""
        rows = (len(chunks) if isinstance(chunks, DecodeChunks)
                else sum(map(len, map(_TOKENS, chunks))))
        bucket = self.sizes.for_step(rows, len(chunks), at_least)
        return bucket if (plan.graph_key, bucket) in self.graphs else None

    def bucket_of(self, rows: int) -> int | None:
        """The decode bucket of `rows` sequences."""
        return self.sizes.decode_rows(rows)

    def _inputs(self, plan, bucket: Bucket) -> list[torch.Tensor]:
        """The graph's tokens and positions (its SP rank's rows), slots, query starts and
        sequence lengths: views of `packed`, where build_step_inputs' pack puts them."""
        key = (plan.state.sp.size, bucket)
        if key not in self._views:
            self._views[key] = [self.packed[start:start + n * dtype.itemsize].view(dtype)
                                for start, n, dtype in input_layout(bucket, *key[:1])]
        return self._views[key]

    def _metadata(self, plan, bucket: Bucket) -> AttentionMetadata:
        rows, seqs = bucket.rows, bucket.seqs
        _, _, slots, starts_d, seq_lens = self._inputs(plan, bucket)
        # the host lists only steer the launch: decodes alone, or one prefill launch
        starts = list(range(seqs + 1)) if bucket.decode else [0] + [rows] * seqs
        return AttentionMetadata(
            slot_mapping=slots, query_start_loc=starts_d, seq_lens=seq_lens,
            block_tables=self.tables[:seqs], query_start_loc_cpu=starts,
            seq_lens_cpu=[self.max_model_len] * seqs, max_query_len=1 if bucket.decode else rows,
            max_seq_len=self.max_model_len, block_size=plan.block_size, static_shape=True)

    def _forward(self, plan, bucket: Bucket) -> torch.Tensor:
        tokens, positions = self._inputs(plan, bucket)[:2]
        received = (None if plan.state.is_first_stage
                    else tuple(t[:len(tokens)] for t in self.received))
        with use_context(plan.context(self._metadata(plan, bucket), self.backend)):
            return self.model_for(plan)(tokens, positions, received)

    def _capture(self, plan, bucket: Bucket):
        self.bind_kv(plan)
        if self.before_capture is not None:
            self.before_capture(plan, bucket.rows)
        self.packed.zero_()
        self._inputs(plan, bucket)[2].fill_(-1)  # no slots: warm-up writes no KV
        for _ in range(2):  # warm up (Triton compilation, allocator) outside the graph
            self._forward(plan, bucket)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self._forward(plan, bucket)
        return graph, hidden

    def run(self, chunks: list[SeqChunk], tables, plan, bucket: Bucket, patch_tokens,
            staging, receive=None):
        """Replays the bucket's graph for this step; returns (its output: the hidden
        states, or a stage's (hidden states, residual) before the last, and the inputs).
        `tables` are the rank's block tables (by chunk.row);
        `patch_tokens(tokens, chunks, inputs)` may rewrite the input tokens first;
        `staging` is a StagingRing (the pack is reserved into the graph's inputs);
        `receive(hidden, residual)`
        fills a later pipeline stage's inputs from the stage before (the bucket's rows)."""
        sp = plan.state.sp
        inputs = build_step_inputs(chunks, tables, plan.block_size, self.packed.device,
                                   sp.size, sp.rank, pad_to=bucket.rows, pad_seqs=bucket.seqs,
                                   staging=staging, into=self.packed)
        self._fill(inputs, plan, bucket)
        patch_tokens(inputs.token_ids, chunks, inputs)
        if receive is not None:
            receive(*(t[:len(inputs.token_ids)] for t in self.received))
        graph, hidden = self.graphs[(plan.graph_key, bucket)]
        graph.replay()
        return hidden, inputs

    def _fill(self, inputs: StepInputs, plan, bucket: Bucket) -> None:
        """The block tables into the graph's; the rest of the pack already is its inputs."""
        attn, seqs = inputs.attn, bucket.seqs
        if attn.seq_lens.data_ptr() != self._inputs(plan, bucket)[4].data_ptr():
            raise RuntimeError(f"a step's pack is not laid out as the graph of {bucket} "
                               f"reads it")
        width = attn.block_tables.shape[1]
        target = self._table_views.get((seqs, width))
        if target is None:
            target = self._table_views[(seqs, width)] = self.tables[:seqs, :width]
        target.copy_(attn.block_tables)
