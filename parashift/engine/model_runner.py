"""Runs the model for one step on this device: builds the step's input
tensors, runs the forward under the active plan, samples."""
import logging
import time

import torch

from parashift.attention.backend import get_backend
from parashift.attention.metadata import AttentionMetadata
from parashift.engine.step_batch import SeqChunk, StepBatch
from parashift.forward_context import ForwardContext, forward_context
from parashift.kv.cache import KVCache
from parashift.layers.sampler import Sampler, SamplerOutput
from parashift.loader.weights import load_model_weights
from parashift.models.registry import model_class_for

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config, hf_config, source, device: torch.device, dtype: torch.dtype,
                 max_model_len: int):
        self.config, self.device, self.dtype = config, device, dtype
        self.block_size = config.block_size
        start = time.perf_counter()
        self.model = self._build_model(hf_config, source, max_model_len)
        self.load_seconds = time.perf_counter() - start
        self.backend = get_backend(config.attention_backend, device)
        self.sampler = Sampler(device, config.seed)
        self.generators: dict[str, torch.Generator] = {}
        self.kv = KVCache.for_model(self.model, config, device, dtype, self._profile_peak_bytes)
        self.kv.bind(self.model)

    def _build_model(self, hf_config, source, max_model_len: int):
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
        return self.kv.num_blocks

    # ---- one step ------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> tuple[list[int], list[dict[int, float] | None] | None]:
        """Runs the step; returns the sampled token of each sampling chunk (in order)
        and, when asked, their logprobs."""
        for request_id in batch.finished_request_ids:
            self.generators.pop(request_id, None)
        token_ids, positions, meta = self._prepare_inputs(batch.chunks)
        with forward_context(ForwardContext(meta, self.backend)):
            hidden = self.model(token_ids, positions)
        sampling = batch.sampling_chunks
        if not sampling:
            return [], None
        last_rows = [meta.query_start_loc_cpu[i + 1] - 1
                     for i, c in enumerate(batch.chunks) if c.sampling is not None]
        logits = self.model.compute_logits(hidden[torch.tensor(last_rows, device=self.device)])
        out = self.sampler(logits, [c.sampling for c in sampling],
                           [self._generator(c) for c in sampling])
        return out.token_ids.tolist(), out.logprobs

    def _generator(self, chunk: SeqChunk) -> torch.Generator | None:
        seed = chunk.sampling.seed
        if seed is None:
            return None
        if chunk.request_id not in self.generators:
            self.generators[chunk.request_id] = Sampler.make_generator(seed, self.device)
        return self.generators[chunk.request_id]

    def _prepare_inputs(self, chunks: list[SeqChunk]):
        token_ids, positions, slots, starts = [], [], [], [0]
        for c in chunks:
            token_ids += c.token_ids
            span = range(c.start_pos, c.seq_len)
            positions += span
            slots += [c.block_table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in span]
            starts.append(starts[-1] + len(c.token_ids))
        seq_lens = [c.seq_len for c in chunks]
        width = max(len(c.block_table) for c in chunks)
        tables = [c.block_table + [0] * (width - len(c.block_table)) for c in chunks]
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            query_start_loc=self._tensor(starts, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            block_tables=self._tensor(tables, torch.int32),
            query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
            max_query_len=max(len(c.token_ids) for c in chunks),
            max_seq_len=max(seq_lens), block_size=self.block_size)
        return self._tensor(token_ids, torch.int64), self._tensor(positions, torch.int64), meta

    def _tensor(self, values, dtype) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    # ---- memory profiling ----------------------------------------------------
    @torch.inference_mode()
    def _profile_peak_bytes(self, scratch_kv: "KVCache") -> int:
        """Peak activation memory of a step of max_num_batched_tokens tokens."""
        num_tokens = self.config.max_num_batched_tokens
        scratch_kv.bind(self.model)
        chunk = SeqChunk("profile", [0] * num_tokens, 0, list(range(scratch_kv.num_blocks)), None)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        token_ids, positions, meta = self._prepare_inputs([chunk])
        with forward_context(ForwardContext(meta, self.backend)):
            hidden = self.model(token_ids, positions)
            self.model.compute_logits(hidden[-min(num_tokens, self.config.max_num_seqs):])
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before
