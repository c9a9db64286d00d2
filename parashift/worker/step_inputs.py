"""The tensors of one step (or one micro-batch) on this rank."""
import functools
from dataclasses import dataclass

import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.worker.step_batch import SeqChunk
from parashift.uploads import upload


@dataclass
class StepInputs:
    token_ids: torch.Tensor       # this rank's rows (an SP slice when SP > 1)
    positions: torch.Tensor
    attn: AttentionMetadata       # the whole step: every SP rank attends over all rows
    sample_rows: list[int]        # rows (of the whole step) whose logits are sampled
    local_rows: range             # the whole-step rows this rank holds


def build_step_inputs(chunks: list[SeqChunk], block_size: int, device: torch.device,
                      sp_size: int = 1, sp_rank: int = 0, pad_to: int = 0) -> StepInputs:
    """`pad_to` pads the step to that many sequences and rows (a CUDA graph's batch
    size): padding sequences hold no rows and no context, padding rows belong to no
    sequence; neither writes KV nor affects the real rows."""
    token_ids, positions, slots, starts = [], [], [], [0]
    for c in chunks:
        token_ids += c.token_ids
        span = range(c.start_pos, c.seq_len)
        positions += span
        slots += [c.block_table[p // block_size] * block_size + p % block_size for p in span]
        starts.append(starts[-1] + len(c.token_ids))
    num_rows = max(len(token_ids), pad_to)
    padding = num_rows - len(token_ids) + (-num_rows % sp_size)  # rows of no sequence
    token_ids += [0] * padding
    positions += [0] * padding
    slots += [-1] * padding
    num_seqs = max(len(chunks), pad_to)
    starts += [starts[-1]] * (num_seqs - len(chunks))
    seq_lens = [c.seq_len for c in chunks] + [0] * (num_seqs - len(chunks))
    width = max(len(c.block_table) for c in chunks)
    tables = [c.block_table + [0] * (width - len(c.block_table)) for c in chunks]
    tables += [[0] * width] * (num_seqs - len(chunks))
    to = functools.partial(upload, device=device)
    attn = AttentionMetadata(
        slot_mapping=to(slots, torch.int64), query_start_loc=to(starts, torch.int32),
        seq_lens=to(seq_lens, torch.int32), block_tables=to(tables, torch.int32),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
        max_query_len=max(len(c.token_ids) for c in chunks), max_seq_len=max(seq_lens),
        block_size=block_size)
    per_rank = len(token_ids) // sp_size
    local = range(sp_rank * per_rank, (sp_rank + 1) * per_rank)
    sample_rows = [starts[i + 1] - 1 for i, c in enumerate(chunks) if c.sampling is not None]
    return StepInputs(to(token_ids[local.start:local.stop], torch.int64),
                      to(positions[local.start:local.stop], torch.int64), attn, sample_rows, local)

