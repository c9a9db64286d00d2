"""CUDA graphs for decode steps, one per (plan, batch-size bucket).

A pure-decode step of B sequences runs as the graph of the smallest bucket >= B,
padded (see build_step_inputs). The bucket is a function of the step message
alone, so every rank of a replica replays the same graph and the collectives
inside stay matched. A pipelined plan's graph holds its stage's layers: a later
stage receives the previous one's hidden states into static buffers before the
replay, and the send and receive stay outside the graphs. Attention metadata is
read from static buffers that each step refills; the split-KV grid was fixed at
capture for max_model_len, which stays correct for any shorter context. On by
default on CUDA (`--enforce-eager` turns them off); tests/engine/test_gpu_engine.py
checks them against eager."""
from operator import attrgetter

import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.worker.step_batch import SeqChunk
from parashift.worker.step_inputs import StepInputs, build_step_inputs
from parashift.context import use_context

_TOKENS = attrgetter("token_ids")
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


class DecodeGraphs:
    def __init__(self, model_for, backend, plans: list, bind_kv, max_model_len: int,
                 max_num_seqs: int, device: torch.device,
                 hidden: tuple[int, torch.dtype] | None = None, before_capture=None):
        """`plans`: the PlanResources of every plan whose decode steps replay graphs;
        `model_for(plan)` the model a plan's steps run (one for every plan, except under
        Seesaw: one per plan); `bind_kv(plan)` points it at the KV pool as that plan reads
        it (each graph captures its plan's view); `hidden`: the hidden size and dtype of
        the states a later pipeline stage receives (needed only with such a stage);
        `before_capture(plan, bucket)` readies what the capture needs (shared FFN weights'
        exchanges padded to the bucket)."""
        self.before_capture = before_capture
        self.model_for, self.backend, self.bind_kv = model_for, backend, bind_kv
        self.max_model_len = max_model_len
        sp_sizes = {p.state.sp.size for p in plans}
        self.buckets = [b for b in DEFAULT_BUCKETS if b <= max_num_seqs
                        and all(b % sp == 0 for sp in sp_sizes)]
        largest = self.buckets[-1]
        max_blocks = -(-max_model_len // min(p.block_size for p in plans))
        self.tokens = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.slots = torch.full((largest,), -1, dtype=torch.int64, device=device)
        self.starts = torch.zeros(largest + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(largest, dtype=torch.int32, device=device)
        self.tables = torch.zeros(largest, max_blocks, dtype=torch.int32, device=device)
        self.received = None  # a later pipeline stage's (hidden states, residual)
        if any(not p.state.is_first_stage for p in plans):
            size, dtype = hidden
            self.received = tuple(torch.zeros(largest, size, dtype=dtype, device=device)
                                  for _ in range(2))
        self.graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        for plan in sorted(plans, key=lambda p: p.graph_key):  # same order on every rank
            for bucket in reversed(self.buckets):
                self.graphs[(plan.graph_key, bucket)] = self._capture(plan, bucket)

    def bucket_for(self, chunks: list[SeqChunk], plan, at_least: int = 0) -> int | None:
        """The graph bucket of a decode step of `chunks` (padded to `at_least` rows: a
        shared-FFN round's), or None where none was captured."""
        if (plan.graph_key, self.buckets[-1]) not in self.graphs \
                or sum(map(len, map(_TOKENS, chunks))) != len(chunks):
            return None  # (every chunk holds a token: one each sums to the chunk count)
        return self.bucket_of(max(len(chunks), at_least))

    def bucket_of(self, rows: int) -> int | None:
        return next((b for b in self.buckets if b >= rows), None)

    def _metadata(self, bucket: int, block_size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slots[:bucket], query_start_loc=self.starts[:bucket + 1],
            seq_lens=self.seq_lens[:bucket], block_tables=self.tables[:bucket],
            query_start_loc_cpu=list(range(bucket + 1)),
            seq_lens_cpu=[self.max_model_len] * bucket, max_query_len=1, max_seq_len=self.max_model_len, block_size=block_size,
            static_shape=True)

    def _forward(self, plan, bucket: int) -> torch.Tensor:
        local = bucket // plan.state.sp.size
        received = (None if plan.state.is_first_stage
                    else tuple(t[:local] for t in self.received))
        with use_context(plan.context(self._metadata(bucket, plan.block_size), self.backend)):
            return self.model_for(plan)(self.tokens[:local], self.positions[:local], received)

    def _capture(self, plan, bucket: int):
        self.bind_kv(plan)
        if self.before_capture is not None:
            self.before_capture(plan, bucket)
        self.slots.fill_(-1)
        self.seq_lens.zero_()
        self.starts.zero_()
        for _ in range(2):  # warm up (Triton compilation, allocator) outside the graph
            self._forward(plan, bucket)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self._forward(plan, bucket)
        return graph, hidden

    def run(self, chunks: list[SeqChunk], tables, plan, bucket: int, patch_tokens,
            upload_all=None, receive=None):
        """Replays the bucket's graph for this step; returns (its output: the hidden
        states, or a stage's (hidden states, residual) before the last, and the inputs).
        `tables` are the rank's block tables (by chunk.row);
        `patch_tokens(tokens, chunks, inputs)` may rewrite the input tokens first;
        `upload_all` is build_step_inputs'; `receive(hidden, residual)` fills a later
        pipeline stage's inputs from the stage before (the bucket's rows)."""
        sp = plan.state.sp
        inputs = build_step_inputs(chunks, tables, plan.block_size, self.tokens.device,
                                   sp.size, sp.rank, pad_to=bucket, upload_all=upload_all)
        self._fill(inputs, bucket)
        patch_tokens(self.tokens[:len(inputs.token_ids)], chunks, inputs)
        if receive is not None:
            receive(*(t[:len(inputs.token_ids)] for t in self.received))
        graph, hidden = self.graphs[(plan.graph_key, bucket)]
        graph.replay()
        return hidden, inputs

    def _fill(self, inputs: StepInputs, bucket: int) -> None:
        local = len(inputs.token_ids)
        self.tokens[:local].copy_(inputs.token_ids)
        self.positions[:local].copy_(inputs.positions)
        attn = inputs.attn
        self.slots[:bucket].copy_(attn.slot_mapping)
        self.starts[:bucket + 1].copy_(attn.query_start_loc)
        self.seq_lens[:bucket].copy_(attn.seq_lens)
        self.tables[:bucket, :attn.block_tables.shape[1]].copy_(attn.block_tables)
