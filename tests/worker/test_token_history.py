"""A rank's token history of the requests with penalties: prompt chunks, placeholders
filled from the previous step's samples, recompute after preemption, a verification's
rows (each sees the draft before its position)."""
import numpy as np
import torch

from parashift.layers.penalties import PADDING_TOKEN
from parashift.sampling_params import SamplingParams
from parashift.step.message import PLACEHOLDER_TOKEN
from parashift.worker.step_chunks import SeqChunk, sample_rows_of
from parashift.worker.token_history import TokenHistoryStore

PENALIZED = SamplingParams(repetition_penalty=1.2)


ROWS: dict[str, int] = {}  # each request's block-table row


def chunk(request_id, tokens, start, samples=True):
    row = ROWS.setdefault(request_id, len(ROWS))
    return SeqChunk(request_id, tokens, start, row, PENALIZED if samples else None)


def prev(index_of: dict[str, int]) -> np.ndarray:
    """The previous step's index in its samples of each request's row (-1: none)."""
    index = np.full(64, -1, np.int64)
    for request_id, i in index_of.items():
        index[ROWS.setdefault(request_id, len(ROWS))] = i
    return index


def rows_of(history) -> list[list[int]]:
    return [[t for t in row if t != PADDING_TOKEN] for row in history.token_ids.tolist()]


def test_prompt_chunks_then_placeholders_from_the_previous_samples():
    store = TokenHistoryStore(torch.device("cpu"))
    store.admit("a", [1, 2, 3, 4, 5])
    store.admit("b", [7, 8])
    store.record([chunk("a", [3], 2, samples=False), chunk("b", [8], 1)], None,
                 prev({}))  # cached
    assert store.batch([chunk("b", [8], 1)]).token_ids.tolist() == [[7, 8]]  # from the message
    store.record([chunk("a", [4, 5], 3), chunk("b", [PLACEHOLDER_TOKEN], 2)],
                 torch.tensor([40]), prev({"b": 0}))
    sampled = torch.tensor([11, 22])  # this step sampled 11 for a, 22 for b
    step = [chunk("b", [PLACEHOLDER_TOKEN], 3), chunk("untracked", [9], 0),
            chunk("a", [PLACEHOLDER_TOKEN], 5)]
    store.record(step, sampled, prev({"a": 0, "b": 1}))
    sampling = [chunk("x", [], 0), step[2], step[0]]
    history = store.batch(sampling)
    assert history.rows == [1, 2]
    assert rows_of(history) == [[1, 2, 3, 4, 5, 11], [7, 8, 40, 22]]
    assert history.is_output.tolist() == [[False] * 5 + [True], [False, False, True, True,
                                                                False, False]]


def test_recompute_overwrites_and_forget_frees_the_slot():
    store = TokenHistoryStore(torch.device("cpu"))
    store.admit("a", [1, 2])
    store.record([chunk("a", [1, 2, 3, 4], 0)], None, prev({}))
    recomputed = chunk("a", [5], 2)  # preempted, recomputed from the cache
    store.record([recomputed], None, prev({}))
    assert rows_of(store.batch([recomputed])) == [[1, 2, 5]]
    slot = store.slots["a"]
    store.forget("a")
    assert store.batch([chunk("a", [], 0)]) is None
    store.admit("b", [])
    assert store.slots["b"] == slot


def test_buffer_grows_past_its_capacity_and_slots():
    store = TokenHistoryStore(torch.device("cpu"))
    for i in range(20):
        store.admit(f"r{i}", [i])
    long = list(range(3000))
    step = [chunk("r0", [5], 1), chunk("r19", long, 0)]
    store.record(step, None, prev({}))
    history = store.batch([step[1], step[0]])
    assert rows_of(history) == [long, [0, 5]]


def test_a_verifications_rows_see_the_draft_before_their_position():
    """A verification of [t, d0, d1] samples three rows; the row after d0 sees the prompt,
    the output and d0 (as if accepted), not d1. After a rejection the next step's chunk
    writes over the rejected draft."""
    store = TokenHistoryStore(torch.device("cpu"))
    store.admit("v", [1, 2])
    verification = chunk("v", [3, 4, 5], 2)  # 3: the last sampled token, 4 5: its draft
    verification.num_samples = 3
    store.record([verification], None, prev({}))
    history = store.batch(sample_rows_of([verification]))
    assert history.rows == [0, 1, 2]
    assert rows_of(history) == [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5]]
    assert history.is_output.tolist()[1] == [False, False, True, True, False]
    after = chunk("v", [9], 4)  # 4 accepted, then 9 sampled instead of 5
    store.record([after], None, prev({}))
    assert rows_of(store.batch([after])) == [[1, 2, 3, 4, 9]]
