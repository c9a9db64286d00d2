"""A rank's persistent request tables: block-table rows and argmax-only flags written by
the step messages' deltas (added, finished and re-sent requests), checked value by value."""
import numpy as np
import torch

from parashift import SamplingParams
from parashift.step.message import ChunkDelta, StepBatch
from parashift.worker.step_chunks import DecodeChunks, RequestTables
from parashift.worker.step_inputs import build_step_inputs

GREEDY = SamplingParams(temperature=0)
RANDOM = SamplingParams(temperature=0.8)


def decode(request_id: str, start: int, sent: int = 0, new_blocks=()) -> ChunkDelta:
    return ChunkDelta(request_id, [-1], start, sent, list(new_blocks), True)


def test_rows_and_flags_follow_the_deltas():
    tables = RequestTables(rows=2, width=2)
    chunks = tables.apply(StepBatch(
        [decode("a", 0, 0, [7]), decode("b", 0, 0, [3, 4]), decode("c", 0, 0, [5])],
        new_params={"a": GREEDY, "b": RANDOM, "c": SamplingParams(temperature=0, logprobs=1)}))
    assert [c.row for c in chunks] == [0, 1, 2]  # the third row made the tables grow
    assert [c.sampling for c in chunks] == [GREEDY, RANDOM, tables.params["c"]]
    assert tables.argmax_only.tolist() == [True, False, False, False]
    assert tables.lengths.tolist() == [1, 2, 1, 0]
    assert tables.tables[:3, :2].tolist() == [[7, 0], [3, 4], [5, 0]]
    chunks = tables.apply(StepBatch([decode("a", 1, 1, [8]), decode("c", 1, 1)],
                                    finished_request_ids=["b"]))
    assert [c.row for c in chunks] == [0, 2]
    assert tables.argmax_only.tolist() == [True, False, False, False]
    assert tables.lengths.tolist() == [2, 0, 1, 0] and tables.table(0) == [7, 8]
    assert tables.free_rows() == [3, 1]
    # a new request takes the freed row; one sent again from block 0 (preempted) rewrites
    chunks = tables.apply(StepBatch([decode("d", 0, 0, [9]), decode("a", 0, 0, [6])],
                                    new_params={"d": GREEDY}))
    assert [c.row for c in chunks] == [1, 0]
    assert tables.argmax_only.tolist() == [True, True, False, False]
    assert tables.table(0) == [6] and tables.table(1) == [9]
    assert np.array_equal(tables.tables[0], [6, 0])


def test_plain_decodes_in_columns_come_first_and_write_only_their_new_blocks():
    tables = RequestTables(rows=4, width=2)
    tables.apply(StepBatch([decode("a", 0, 0, [7]), decode("b", 0, 0, [3, 4])],
                           new_params={"a": GREEDY, "b": RANDOM}))
    chunks = tables.apply(StepBatch(
        [decode("c", 0, 0, [5])], new_params={"c": GREEDY}, decode_ids=["b", "a"],
        decode_starts=[8, 4], decode_blocks=[2, 1], decode_new_blocks={1: [9, 6]}))
    assert [(c.request_id, c.token_ids, c.start_pos, c.row, c.sampling) for c in chunks] == [
        ("b", [-1], 8, 1, RANDOM), ("a", [-1], 4, 0, GREEDY), ("c", [-1], 0, 2, GREEDY)]
    assert tables.table(0) == [7, 9, 6] and tables.table(1) == [3, 4]
    assert tables.lengths.tolist()[:3] == [3, 2, 1]


def test_parameters_sent_again_rewrite_the_flag_of_a_kept_row():
    tables = RequestTables()
    tables.apply(StepBatch([decode("a", 0, 0, [1])], new_params={"a": GREEDY}))
    assert tables.argmax_only[tables.row_of["a"]]
    tables.apply(StepBatch([decode("a", 1, 1)], new_params={"a": RANDOM}))
    assert not tables.argmax_only[tables.row_of["a"]]


def test_argmax_only_means_nothing_but_the_argmax():
    assert GREEDY.argmax_only and SamplingParams(top_k=1).argmax_only
    assert SamplingParams(temperature=0, seed=3).argmax_only  # a greedy row ignores its seed
    for params in (RANDOM, SamplingParams(temperature=0, logprobs=0),
                   SamplingParams(temperature=0, logit_bias={1: 2.0}),
                   SamplingParams(temperature=0, repetition_penalty=1.2),
                   SamplingParams(temperature=0, presence_penalty=0.5)):
        assert not params.argmax_only, params


def test_a_step_of_plain_decodes_only_gives_its_rows_and_starts_as_arrays():
    """DecodeChunks: the arrays build_step_inputs reads instead of the chunks, with the
    inputs it builds from the chunks one by one (padded to a graph's bucket)."""
    tables = RequestTables(rows=4, width=4)
    tables.apply(StepBatch([decode("a", 0, 0, [7]), decode("b", 0, 0, [3, 4])],
                           new_params={"a": GREEDY, "b": RANDOM}))
    chunks = tables.apply(StepBatch([], decode_ids=["b", "a"], decode_starts=[5, 4],
                                    decode_blocks=[2, 1], decode_new_blocks={1: [9]}))
    assert isinstance(chunks, DecodeChunks)
    assert chunks.rows.tolist() == [1, 0] and chunks.starts.tolist() == [5, 4]
    assert [(c.request_id, c.start_pos, c.row) for c in chunks] == [("b", 5, 1), ("a", 4, 0)]
    fast = build_step_inputs(chunks, tables.tables, 4, torch.device("cpu"), pad_to=4)
    plain = build_step_inputs(list(chunks), tables.tables, 4, torch.device("cpu"), pad_to=4)
    assert fast.attn.slot_mapping.tolist() == [17, 36, -1, -1]  # b: block 4; a: block 9
    for name in ("token_ids", "positions"):
        assert getattr(fast, name).tolist() == getattr(plain, name).tolist()
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        assert getattr(fast.attn, name).tolist() == getattr(plain.attn, name).tolist()
    assert fast.attn.query_start_loc_cpu == plain.attn.query_start_loc_cpu
    assert (fast.sample_rows, fast.last_rows.tolist(), fast.sample_table_rows.tolist()) == \
        (plain.sample_rows, plain.last_rows.tolist(), plain.sample_table_rows.tolist())
    assert not isinstance(tables.apply(StepBatch([decode("a", 6, 2)], decode_ids=["b"],
                                                 decode_starts=[6], decode_blocks=[2])),
                          DecodeChunks)


def test_a_step_of_decodes_read_after_its_requests_finished_keeps_their_parameters():
    """DecodeChunks makes its SeqChunks when first read: what they hold is the step's, even
    when the read comes after a later message finished a request (a sampler or the step
    check reading the step once the next one was applied)."""
    tables = RequestTables(rows=4, width=4)
    tables.apply(StepBatch([decode("a", 0, 0, [7]), decode("b", 0, 0, [3])],
                           new_params={"a": GREEDY, "b": RANDOM}))
    chunks = tables.apply(StepBatch([], decode_ids=["a", "b"], decode_starts=[3, 5],
                                    decode_blocks=[1, 1]))
    tables.apply(StepBatch([], decode_ids=["a"], decode_starts=[4], decode_blocks=[1],
                           finished_request_ids=["b"]))
    assert "b" not in tables.params
    assert len(chunks) == 2 and bool(chunks)
    assert [(c.request_id, c.start_pos, c.row, c.sampling) for c in chunks] == \
        [("a", 3, 0, GREEDY), ("b", 5, 1, RANDOM)]
    assert chunks[1].request_id == "b" and [c.request_id for c in chunks[:1]] == ["a"]
