"""The tensors of one step (or one micro-batch) on this rank, computed with array
operations from the chunks and the rank's persistent block tables: a few Python
attribute reads per chunk, no per-token Python work."""
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_not, itemgetter

import numpy as np
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.worker.step_batch import PLACEHOLDER_TOKEN, DecodeChunks, SeqChunk
from parashift.uploads import FreshUploads

# C-level readers of the chunks' fields (a map over them costs a fraction of a generator)
_ROW, _START, _TOKENS = attrgetter("row"), attrgetter("start_pos"), attrgetter("token_ids")
_SAMPLING, _FIRST = attrgetter("sampling"), itemgetter(0)


@dataclass
class StepInputs:
    token_ids: torch.Tensor       # this rank's rows (an SP slice when SP > 1)
    positions: torch.Tensor
    attn: AttentionMetadata       # the whole step: every SP rank attends over all rows
    sample_rows: list[int]        # rows (of the whole step) whose logits are sampled
    local_rows: range             # the whole-step rows this rank holds
    chunk_rows: np.ndarray        # each chunk's row in the block tables
    last_rows: np.ndarray         # each chunk's last row (of the whole step)
    last_tokens: np.ndarray       # each chunk's last input token (PLACEHOLDER_TOKEN or not)
    sample_table_rows: np.ndarray  # the block-table row of each chunk sampled, in order


def build_step_inputs(chunks: list[SeqChunk], tables: np.ndarray, block_size: int,
                      device: torch.device, sp_size: int = 1, sp_rank: int = 0,
                      pad_to: int = 0, staging=None, into: torch.Tensor | None = None,
                      pad_seqs: int | None = None) -> StepInputs:
    """`tables` holds each chunk's block table in the row `chunk.row`. `pad_to` pads the
    step to that many rows and sequences (a CUDA graph's batch size; `pad_seqs` sequences
    instead where given): padding sequences hold no rows and no context, padding rows
    belong to no sequence; neither writes KV nor affects the real rows. The arrays are
    written in place into a pack that `staging` (a StagingRing; by default fresh arrays,
    a tensor each) reserves, into `into` where given (a CUDA graph's inputs)."""
    n = len(chunks)
    if isinstance(chunks, DecodeChunks):  # no pass over the chunks
        rows, first, q_lens = chunks.rows, chunks.starts, np.ones(n, np.int64)
        tokens, num_tokens, sampled = np.full(n, PLACEHOLDER_TOKEN, np.int64), n, slice(None)
    else:
        rows = np.fromiter(map(_ROW, chunks), np.int64, n)
        first = np.fromiter(map(_START, chunks), np.int64, n)
        q_lens = np.fromiter(map(len, map(_TOKENS, chunks)), np.int64, n)
        tokens, num_tokens = None, int(q_lens.sum())
        sampled = np.fromiter(map(is_not, map(_SAMPLING, chunks), repeat(None)), bool, n)
    if num_tokens == n:  # a decode step: one token per chunk
        if tokens is None:
            tokens = np.fromiter(map(_FIRST, map(_TOKENS, chunks)), np.int64, n)
        positions, owner, max_query_len = first, rows, 1
    else:
        tokens = np.fromiter(chain.from_iterable(c.token_ids for c in chunks), np.int64,
                             num_tokens)
        chunk_of_token = np.repeat(np.arange(n), q_lens)
        starts = np.cumsum(q_lens) - q_lens
        positions = np.arange(num_tokens) - starts[chunk_of_token] + first[chunk_of_token]
        owner, max_query_len = rows[chunk_of_token], int(q_lens.max())
    seq_lens = first + q_lens
    max_seq_len = int(seq_lens.max())
    num_rows = max(num_tokens, pad_to)
    num_rows += -num_rows % sp_size  # the rows past num_tokens belong to no sequence
    num_seqs = max(n, pad_to if pad_seqs is None else pad_seqs)
    width = -(-max_seq_len // block_size)
    per_rank = num_rows // sp_size
    local = range(sp_rank * per_rank, (sp_rank + 1) * per_rank)
    staging = staging or FreshUploads(device)
    host, _ = staging.reserve([((per_rank,), torch.int64), ((per_rank,), torch.int64),
                               ((num_rows,), torch.int64), ((num_seqs + 1,), torch.int32),
                               ((num_seqs,), torch.int32), ((num_seqs, width), torch.int32)],
                              into)
    tokens_h, positions_h, slots_h, query_start, seq_lens_h, tables_h = host
    _write_local(tokens_h, tokens, local)
    _write_local(positions_h, positions, local)
    slots = slots_h[:num_tokens]
    np.multiply(tables[owner, positions // block_size], block_size, out=slots, dtype=np.int64)
    slots += positions % block_size
    slots_h[num_tokens:] = -1
    query_start[0] = 0
    np.cumsum(q_lens, out=query_start[1:n + 1])
    query_start[n + 1:] = num_tokens
    seq_lens_h[:n] = seq_lens
    seq_lens_h[n:] = 0
    tables_h[:n] = tables[rows, :width]
    tables_h[n:] = 0
    starts_cpu, seq_lens_cpu = query_start.tolist(), seq_lens_h.tolist()
    token_ids, positions_d, slot_mapping, starts_d, seq_lens_d, block_tables_d = staging.send()
    attn = AttentionMetadata(
        slot_mapping=slot_mapping, query_start_loc=starts_d, seq_lens=seq_lens_d,
        block_tables=block_tables_d, query_start_loc_cpu=starts_cpu, seq_lens_cpu=seq_lens_cpu,
        max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=block_size)
    last_rows = np.cumsum(q_lens) - 1
    return StepInputs(token_ids, positions_d, attn, last_rows[sampled].tolist(), local, rows,
                      last_rows, tokens[last_rows], rows[sampled])


def _write_local(target: np.ndarray, values: np.ndarray, local: range) -> None:
    """Rows `local` of `values` padded with zeros (an SP rank's slice) into `target`."""
    held = values[local.start:local.stop]
    target[:len(held)] = held
    target[len(held):] = 0
