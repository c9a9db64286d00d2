"""The tensors of one step (or one micro-batch) on this rank, computed with array
operations from the chunks and the rank's persistent block tables: a few Python
attribute reads per chunk, no per-token Python work."""
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_not, itemgetter

import numpy as np
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.step.message import PLACEHOLDER_TOKEN
from parashift.worker.step_chunks import DecodeChunks, SeqChunk
from parashift.uploads import FreshUploads, pack_offsets

# C-level readers of the chunks' fields (a map over them costs a fraction of a generator)
_ROW, _START, _TOKENS = attrgetter("row"), attrgetter("start_pos"), attrgetter("token_ids")
_SAMPLING, _FIRST = attrgetter("sampling"), itemgetter(0)
_NUM_SAMPLES = attrgetter("num_samples")


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
    if isinstance(chunks, DecodeChunks):
        return _decode_step_inputs(chunks, tables, block_size, device, sp_size, sp_rank,
                                   pad_to, staging, into, pad_seqs)
    n = len(chunks)
    rows = np.fromiter(map(_ROW, chunks), np.int64, n)
    first = np.fromiter(map(_START, chunks), np.int64, n)
    q_lens = np.fromiter(map(len, map(_TOKENS, chunks)), np.int64, n)
    num_tokens = int(q_lens.sum())
    sampled = np.fromiter(map(is_not, map(_SAMPLING, chunks), repeat(None)), bool, n)
    if num_tokens == n:  # a decode step: one token per chunk
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
    width = -(-max_seq_len // block_size)
    staging = staging or FreshUploads(device)
    host, local, num_seqs = _reserve(staging, into, n, num_tokens, width, sp_size, sp_rank,
                                     pad_to, pad_seqs)
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
        max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=block_size,
        block_tables_cpu=tables_h)
    last_rows = np.cumsum(q_lens) - 1
    sample_rows, sample_table_rows = _sampled_rows(chunks, sampled, last_rows, rows)
    return StepInputs(token_ids, positions_d, attn, sample_rows, local, rows,
                      last_rows, tokens[last_rows], sample_table_rows)


def step_pack_bytes(num_tokens: int, num_seqs: int, width: int) -> int:
    """The bytes of build_step_inputs' pack for a step of `num_tokens` rows and `num_seqs`
    sequences of block tables `width` wide (one SP rank)."""
    return pack_offsets([8 * num_tokens] * 3 + [4 * (num_seqs + 1), 4 * num_seqs,
                                                4 * num_seqs * width])[1]


def _sampled_rows(chunks: list[SeqChunk], sampled: np.ndarray, last_rows: np.ndarray,
                  rows: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The step's rows sampled (the last of each sampling chunk; a verification's last
    1 + k) and the block-table row of each."""
    counts = np.fromiter(map(_NUM_SAMPLES, chunks), np.int64, len(chunks)) * sampled
    if not len(counts) or counts.max() <= 1:
        return last_rows[sampled].tolist(), rows[sampled]
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    back = np.repeat(counts, counts) - 1 - within
    return (np.repeat(last_rows, counts) - back).tolist(), np.repeat(rows, counts)


def _decode_step_inputs(chunks: DecodeChunks, tables: np.ndarray, block_size: int,
                        device: torch.device, sp_size: int, sp_rank: int, pad_to: int,
                        staging, into: torch.Tensor | None, pad_seqs: int | None
                        ) -> StepInputs:
    """build_step_inputs of plain decodes (a placeholder token each, every one sampled):
    the same pack from the chunks' row and start arrays, in as few array operations as the
    pack allows. A step runs right after the host's wait for the device, with its caches
    cold, where each array operation costs several times what it does in a loop."""
    n, rows, starts = len(chunks), chunks.rows, chunks.starts
    max_seq_len = int(starts.max()) + 1
    width = -(-max_seq_len // block_size)
    staging = staging or FreshUploads(device)
    host, local, num_seqs = _reserve(staging, into, n, n, width, sp_size, sp_rank, pad_to,
                                     pad_seqs)
    tokens_h, positions_h, slots_h, query_start, seq_lens_h, tables_h = host
    per_rank, num_rows = len(local), len(slots_h)
    held = max(0, min(n, local.stop) - local.start)  # this rank's real rows
    tokens_h[:held] = PLACEHOLDER_TOKEN
    _write_local(positions_h, starts, local)
    blocks, offsets = np.divmod(starts, block_size)
    slots = slots_h[:n]
    np.multiply(tables[rows, blocks], block_size, out=slots, dtype=np.int64)
    slots += offsets
    np.minimum(counting(num_seqs + 1), n, out=query_start, dtype=np.int32, casting="unsafe")
    np.add(starts, 1, out=seq_lens_h[:n], casting="unsafe")
    tables_h[:n] = tables[rows, :width]
    if held < per_rank:
        tokens_h[held:] = 0
    if n < num_rows:
        slots_h[n:] = -1
    if n < num_seqs:
        seq_lens_h[n:] = 0
        tables_h[n:] = 0
    starts_cpu = list(range(n + 1))
    starts_cpu += [n] * (num_seqs - n)
    seq_lens_cpu = seq_lens_h.tolist()
    token_ids, positions_d, slot_mapping, starts_d, seq_lens_d, block_tables_d = staging.send()
    attn = AttentionMetadata(
        slot_mapping=slot_mapping, query_start_loc=starts_d, seq_lens=seq_lens_d,
        block_tables=block_tables_d, query_start_loc_cpu=starts_cpu, seq_lens_cpu=seq_lens_cpu,
        max_query_len=1, max_seq_len=max_seq_len, block_size=block_size)
    return StepInputs(token_ids, positions_d, attn, starts_cpu[:n], local, rows, counting(n),
                      placeholders(n), rows)


def _reserve(staging, into: torch.Tensor | None, num_chunks: int, num_tokens: int, width: int,
             sp_size: int, sp_rank: int, pad_to: int, pad_seqs: int | None
             ) -> tuple[list[np.ndarray], range, int]:
    """The step's pack, reserved: its arrays (tokens and positions of this rank's rows,
    slots, query starts, sequence lengths, block tables), the rows of the whole step this
    rank holds, and the sequences, padding included."""
    num_rows = max(num_tokens, pad_to)
    num_rows += -num_rows % sp_size  # the rows past num_tokens belong to no sequence
    num_seqs = max(num_chunks, pad_to if pad_seqs is None else pad_seqs)
    per_rank = num_rows // sp_size
    host, _ = staging.reserve([((per_rank,), torch.int64), ((per_rank,), torch.int64),
                               ((num_rows,), torch.int64), ((num_seqs + 1,), torch.int32),
                               ((num_seqs,), torch.int32), ((num_seqs, width), torch.int32)],
                              into)
    return host, range(sp_rank * per_rank, (sp_rank + 1) * per_rank), num_seqs


_COUNTING = np.arange(0)
_PLACEHOLDERS = np.full(0, PLACEHOLDER_TOKEN)


def counting(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 (int64), a read-only view of an array made once."""
    global _COUNTING
    if len(_COUNTING) < n:
        _COUNTING = np.arange(max(n, 2 * len(_COUNTING), 1024), dtype=np.int64)
        _COUNTING.flags.writeable = False
    return _COUNTING[:n]


def placeholders(n: int) -> np.ndarray:
    """n placeholder tokens (int64), a read-only view of an array made once."""
    global _PLACEHOLDERS
    if len(_PLACEHOLDERS) < n:
        _PLACEHOLDERS = np.full(max(n, 2 * len(_PLACEHOLDERS), 1024), PLACEHOLDER_TOKEN,
                                np.int64)
        _PLACEHOLDERS.flags.writeable = False
    return _PLACEHOLDERS[:n]


def _write_local(target: np.ndarray, values: np.ndarray, local: range) -> None:
    """Rows `local` of `values` padded with zeros (an SP rank's slice) into `target`."""
    held = values[local.start:local.stop]
    target[:len(held)] = held
    target[len(held):] = 0
