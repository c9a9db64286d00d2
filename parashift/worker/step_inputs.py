"""The tensors of one step (or one micro-batch) on this rank, computed with array
operations from the chunks and the rank's persistent block tables: a few Python
attribute reads per chunk, no per-token Python work."""
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_not, itemgetter

import numpy as np
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.worker.step_batch import SeqChunk
from parashift.uploads import upload_each

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
                      pad_to: int = 0, upload_all=None,
                      pad_seqs: int | None = None) -> StepInputs:
    """`tables` holds each chunk's block table in the row `chunk.row`. `pad_to` pads the
    step to that many rows and sequences (a CUDA graph's batch size; `pad_seqs` sequences
    instead where given): padding sequences hold no rows and no context, padding rows
    belong to no sequence; neither writes KV nor affects the real rows. `upload_all` takes
    [(array, dtype)] to device tensors in one go (a `StagingRing`'s upload; by default a
    tensor each)."""
    n = len(chunks)
    rows = np.fromiter(map(_ROW, chunks), np.int64, n)
    first = np.fromiter(map(_START, chunks), np.int64, n)
    q_lens = np.fromiter(map(len, map(_TOKENS, chunks)), np.int64, n)
    num_tokens = int(q_lens.sum())
    if num_tokens == n:  # a decode step: one token per chunk
        tokens = np.fromiter(map(_FIRST, map(_TOKENS, chunks)), np.int64, n)
        positions, owner = first, rows
    else:
        tokens = np.fromiter(chain.from_iterable(c.token_ids for c in chunks), np.int64,
                             num_tokens)
        chunk_of_token = np.repeat(np.arange(n), q_lens)
        starts = np.cumsum(q_lens) - q_lens
        positions = np.arange(num_tokens) - starts[chunk_of_token] + first[chunk_of_token]
        owner = rows[chunk_of_token]
    slots = tables[owner, positions // block_size].astype(np.int64) * block_size \
        + positions % block_size
    num_rows = max(num_tokens, pad_to)
    padding = num_rows - num_tokens + (-num_rows % sp_size)  # rows of no sequence
    num_seqs = max(n, pad_to if pad_seqs is None else pad_seqs)
    query_start = np.zeros(num_seqs + 1, np.int64)
    np.cumsum(q_lens, out=query_start[1:n + 1])
    query_start[n + 1:] = num_tokens
    seq_lens = np.zeros(num_seqs, np.int64)
    seq_lens[:n] = first + q_lens
    width = int(-(-seq_lens.max() // block_size))
    block_tables = np.zeros((num_seqs, width), np.int32)
    block_tables[:n] = tables[rows, :width]
    tokens = np.concatenate((tokens, np.zeros(padding, np.int64)))
    positions = np.concatenate((positions, np.zeros(padding, np.int64)))
    slots = np.concatenate((slots, np.full(padding, -1, np.int64)))
    starts_cpu, seq_lens_cpu = query_start.tolist(), seq_lens.tolist()
    per_rank = len(tokens) // sp_size
    local = range(sp_rank * per_rank, (sp_rank + 1) * per_rank)
    if upload_all is None:
        def upload_all(arrays):
            return upload_each(arrays, device)
    token_ids, positions_d, slot_mapping, starts_d, seq_lens_d, block_tables_d = upload_all([
        (tokens[local.start:local.stop], torch.int64),
        (positions[local.start:local.stop], torch.int64), (slots, torch.int64),
        (query_start, torch.int32), (seq_lens, torch.int32), (block_tables, torch.int32)])
    attn = AttentionMetadata(
        slot_mapping=slot_mapping, query_start_loc=starts_d, seq_lens=seq_lens_d,
        block_tables=block_tables_d, query_start_loc_cpu=starts_cpu, seq_lens_cpu=seq_lens_cpu,
        max_query_len=int(q_lens.max()), max_seq_len=max(seq_lens_cpu), block_size=block_size)
    last_rows = query_start[1:n + 1] - 1
    sampled = np.fromiter(map(is_not, map(_SAMPLING, chunks), repeat(None)), bool, n)
    return StepInputs(token_ids, positions_d, attn, last_rows[sampled].tolist(), local, rows,
                      last_rows, tokens[last_rows], rows[sampled])

