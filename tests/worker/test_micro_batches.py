"""How a pipelined step's chunks become micro-batches."""
from parashift.sampling_params import SamplingParams
from parashift.worker.model_runner import split_micro_batches
from parashift.worker.step_chunks import SeqChunk

GREEDY = SamplingParams(temperature=0)


def chunk(request_id: str, length: int, start: int = 0, row: int = 0) -> SeqChunk:
    return SeqChunk(request_id, list(range(start, start + length)), start, row, GREEDY)


def shape(groups: list[list[SeqChunk]]) -> list[list[tuple]]:
    return [[(c.request_id, c.start_pos, len(c.token_ids), c.sampling is not None)
             for c in group] for group in groups]


def test_a_step_of_decodes_runs_whole():
    decodes = [chunk(str(i), 1, start=40, row=i) for i in range(64)]
    assert shape(split_micro_batches(decodes, 4, 256)) == [
        [(str(i), 40, 1, True) for i in range(64)]]


def test_a_long_prompt_is_cut_into_one_part_per_stage():
    groups = split_micro_batches([chunk("a", 1024, start=24)], 4, 256)
    assert shape(groups) == [[("a", 24, 256, False)], [("a", 280, 256, False)],
                             [("a", 536, 256, False)], [("a", 792, 256, True)]]
    assert [t for g in groups for c in g for t in c.token_ids] == list(range(24, 1048))
    assert len(split_micro_batches([chunk("a", 1023)], 4, 256)) == 3  # 341 tokens each


def test_micro_batches_hold_at_least_the_least_tokens():
    """600 tokens at 256 a micro-batch: two of 300, though the pipeline has four stages."""
    groups = split_micro_batches([chunk("a", 100), chunk("b", 1, row=1), chunk("c", 499, row=2)],
                                 4, 256)
    assert shape(groups) == [[("a", 0, 100, True), ("b", 0, 1, True), ("c", 0, 199, False)],
                             [("c", 199, 300, True)]]
    assert groups[1][0].row == 2


def test_chunks_that_end_on_a_boundary_are_not_cut():
    groups = split_micro_batches([chunk("a", 300), chunk("b", 300, row=1)], 2, 256)
    assert shape(groups) == [[("a", 0, 300, True)], [("b", 0, 300, True)]]
    assert split_micro_batches([chunk("a", 300)], 1, 1)[0][0].token_ids == list(range(300))
