"""build_step_inputs: a step of plain decodes (DecodeChunks, its own path) gives exactly
what the general path gives for the same chunks as SeqChunks."""
import numpy as np
import pytest
import torch

from parashift.sampling_params import SamplingParams
from parashift.step.message import PLACEHOLDER_ONLY
from parashift.uploads import StagingRing
from parashift.worker.step_chunks import DecodeChunks, SeqChunk
from parashift.worker.step_inputs import build_step_inputs, counting, placeholders

CPU = torch.device("cpu")
BLOCK = 4


def _decodes(rows: list[int], starts: list[int]):
    params = [SamplingParams(temperature=0) for _ in rows]
    ids = [f"r{row}" for row in rows]
    as_seq_chunks = [SeqChunk(i, PLACEHOLDER_ONLY, start, row, p)
                     for i, start, row, p in zip(ids, starts, rows, params)]
    return DecodeChunks(ids, rows, starts, params), as_seq_chunks


def _as_lists(inputs) -> dict:
    attn = inputs.attn
    return dict(
        token_ids=inputs.token_ids.tolist(), positions=inputs.positions.tolist(),
        slots=attn.slot_mapping.tolist(), starts=attn.query_start_loc.tolist(),
        seq_lens=attn.seq_lens.tolist(), tables=attn.block_tables.tolist(),
        starts_cpu=attn.query_start_loc_cpu, seq_lens_cpu=attn.seq_lens_cpu,
        max_query_len=attn.max_query_len, max_seq_len=attn.max_seq_len,
        sample_rows=inputs.sample_rows, local_rows=inputs.local_rows,
        chunk_rows=inputs.chunk_rows.tolist(), last_rows=inputs.last_rows.tolist(),
        last_tokens=inputs.last_tokens.tolist(),
        sample_table_rows=inputs.sample_table_rows.tolist())


@pytest.mark.parametrize("sp_size", [1, 2, 4])
@pytest.mark.parametrize("pad_to,pad_seqs", [(0, None), (8, None), (12, 9)])
@pytest.mark.parametrize("packed", [False, True])
def test_decode_path_matches_the_general_path(sp_size, pad_to, pad_seqs, packed):
    rng = np.random.default_rng(sp_size * 100 + pad_to)
    tables = rng.integers(1, 500, (16, 10)).astype(np.int32)
    rows, starts = [7, 2, 11, 5, 0], [3, 17, 30, 8, 0]
    decodes, seq_chunks = _decodes(rows, starts)
    for sp_rank in range(sp_size):
        got, want = [], []
        for chunks, out in ((decodes, got), (seq_chunks, want)):
            staging = StagingRing(CPU) if packed else None
            into = torch.zeros(1 << 12, dtype=torch.uint8) if packed else None
            out.append(_as_lists(build_step_inputs(
                chunks, tables, BLOCK, CPU, sp_size, sp_rank, pad_to=pad_to,
                staging=staging, into=into, pad_seqs=pad_seqs)))
        assert got == want, f"SP rank {sp_rank} of {sp_size}"
    # the slots written are each decode's position in its own blocks
    single = build_step_inputs(decodes, tables, BLOCK, CPU)
    assert single.attn.slot_mapping.tolist() == [
        int(tables[row, start // BLOCK]) * BLOCK + start % BLOCK
        for row, start in zip(rows, starts)]


def test_shared_arrays_are_read_only_and_grow():
    assert counting(3).tolist() == [0, 1, 2]
    assert placeholders(2).tolist() == [-1, -1]
    with pytest.raises(ValueError):
        counting(3)[0] = 5
    longer = counting(5000)
    assert len(longer) == 5000 and longer[-1] == 4999 and not longer.flags.writeable
    assert placeholders(5000).min() == -1 == placeholders(5000).max()
