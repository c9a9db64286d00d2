"""The binary step message: every field a rank uses survives the round trip exactly."""
import random
import struct

import numpy as np
import pytest

from parashift.sampling_params import SEED_MAX, SEED_MIN, SamplingParams
from parashift.structured.matchers import TokenMasks
from parashift.step.codec import HEADER, decode_step, encode_step
from parashift.step.message import PLACEHOLDER_TOKEN, ChunkDelta, KVSwap, StepBatch

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "logprobs",
                   "prompt_logprobs", "greedy",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")


def round_trip(batch: StepBatch) -> StepBatch:
    decoded = decode_step(encode_step(batch))
    assert decoded.chunks == batch.chunks
    assert (decoded.decode_ids, decoded.decode_starts, decoded.decode_blocks,
            decoded.decode_new_blocks) == (batch.decode_ids, batch.decode_starts,
                                           batch.decode_blocks, batch.decode_new_blocks)
    assert all(type(c.samples) is int for c in decoded.chunks)  # rows sampled: 0, 1, 1 + k
    assert decoded.finished_request_ids == batch.finished_request_ids
    assert decoded.plan == batch.plan
    assert (decoded.token_masks is None) == (batch.token_masks is None)
    if batch.token_masks is not None:
        assert decoded.token_masks.chunks == batch.token_masks.chunks
        np.testing.assert_array_equal(decoded.token_masks.bitmask, batch.token_masks.bitmask)
    assert decoded.prompts == batch.prompts
    assert list(decoded.new_params) == list(batch.new_params)
    for request_id, params in batch.new_params.items():
        got = decoded.new_params[request_id]
        for name in SAMPLING_FIELDS:
            assert getattr(got, name) == getattr(params, name), name
            assert type(getattr(got, name)) is type(getattr(params, name)) or name == "temperature"
    return decoded


def test_empty_batch():
    assert round_trip(StepBatch([])) == StepBatch([])
    assert round_trip(StepBatch([], plan="shift")).plan == "shift"


def test_chunks_with_placeholders_and_new_blocks():
    round_trip(StepBatch(
        [ChunkDelta("a", [5, 6, 7], 0, 0, [0, 1], False),
         ChunkDelta("b", [PLACEHOLDER_TOKEN], 40, 2, [9], True),
         ChunkDelta("c", [], 3, 1, [], False),
         ChunkDelta("d", [1, PLACEHOLDER_TOKEN], 17, 0, [2**40, 0, 3], True)],
        finished_request_ids=["x", "y"], plan="tp2"))


def test_a_verification_samples_its_draft_positions():
    """A verification of 3 draft tokens: its last token and the drafts, 4 rows sampled."""
    batch = round_trip(StepBatch([ChunkDelta("v", [9, 1, 2, 3], 12, 1, [], 4),
                                  ChunkDelta("w", [5], 7, 0, [], 1)]))
    assert [c.samples for c in batch.chunks] == [4, 1]


def test_plain_decodes_in_columns_before_the_chunks():
    batch = round_trip(StepBatch(
        [ChunkDelta("c", [5, 6], 9, 1, [4], True)], finished_request_ids=["x"],
        decode_ids=["a", "bé", "d"], decode_starts=[40, 2**33, 7], decode_blocks=[3, 0, 2],
        decode_new_blocks={2: [11, 2**40], 1: [6]}))
    assert [(c.request_id, c.token_ids, c.start_pos, c.blocks_from, c.new_blocks, c.samples)
            for c in batch.all_chunks()] == [("a", [PLACEHOLDER_TOKEN], 40, 3, [], True),
                                             ("bé", [PLACEHOLDER_TOKEN], 2**33, 0, [6], True),
                                             ("d", [PLACEHOLDER_TOKEN], 7, 2, [11, 2**40], True),
                                             ("c", [5, 6], 9, 1, [4], True)]


def test_a_shared_ffn_round():
    batch = round_trip(StepBatch([ChunkDelta("a", [1], 0, 0, [0], True)], round_id=7,
                                 round_rows=24))
    assert (batch.round_id, batch.round_rows) == (7, 24)
    counted = round_trip(StepBatch([ChunkDelta("a", [1, 2, 3], 0, 0, [0], True)], round_id=8,
                                   round_tokens={2: 3, 3: 3, 0: 0, 1: 0}))
    assert counted.round_tokens == {2: 3, 3: 3, 0: 0, 1: 0} and counted.round_rows == 0


def test_token_masks():
    rng = np.random.default_rng(0)
    bitmask = rng.integers(-2**31, 2**31, size=(2, 1536), dtype=np.int32)
    batch = StepBatch([ChunkDelta(r, [1], 0, 0, [0], True) for r in "abc"], plan="tp2",
                      token_masks=TokenMasks([0, 2], bitmask))
    decoded = round_trip(batch)
    assert decoded.token_masks.bitmask.dtype == np.int32


def test_unicode_and_odd_request_ids():
    ids = ["ünïcode-é", "日本語", "emoji 😀 id", "", "nul\x00inside", "a" * 300, "\ud800lone"]
    round_trip(StepBatch([ChunkDelta(r, [1], 0, 0, [i], True) for i, r in enumerate(ids)],
                         {r: SamplingParams() for r in ids}, finished_request_ids=ids[::-1],
                         plan="sp2·tp2"))


@pytest.mark.parametrize("seed", [None, 0, 1, -1, SEED_MIN, SEED_MAX])
@pytest.mark.parametrize("logprobs", [None, 0, 5])
def test_sampling_params(seed, logprobs):
    params = {"greedy": SamplingParams(temperature=0.0, seed=seed, logprobs=logprobs),
              "top1": SamplingParams(temperature=0.8, top_k=1, seed=seed),
              "sampled": SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                                        seed=seed, logprobs=logprobs, max_tokens=None)}
    decoded = round_trip(StepBatch([ChunkDelta(r, [3], 0, 0, [0], True) for r in params],
                                   params))
    assert [p.greedy for p in decoded.new_params.values()] == [True, True, False]


def test_penalties_logit_bias_and_prompts():
    params = {"plain": SamplingParams(),
              "penalized": SamplingParams(presence_penalty=-1.5, frequency_penalty=0.25,
                                          repetition_penalty=1.3),
              "biased": SamplingParams(logit_bias={0: -100.0, 49151: 2.5, 7: 0.1}),
              "both": SamplingParams(repetition_penalty=0.7, logit_bias={3: 1.0})}
    round_trip(StepBatch([ChunkDelta(r, [3], 0, 0, [0], True) for r in params], params,
                         prompts={"plain": [1], "penalized": list(range(4000)), "both": []}))


def test_prompt_logprobs_and_their_prompts():
    params = {"none": SamplingParams(), "zero": SamplingParams(prompt_logprobs=0),
              "five": SamplingParams(prompt_logprobs=5, logprobs=2)}
    round_trip(StepBatch([ChunkDelta(r, [3, 4], 0, 0, [0], True) for r in params], params,
                         prompts={"zero": [3, 4, 5], "five": [3, 4]}))


def test_top_k_past_int64_is_clamped():
    params = SamplingParams(top_k=10**30, logprobs=10**30)
    got = decode_step(encode_step(StepBatch([], {"r": params}))).new_params["r"]
    assert got.top_k == got.logprobs == SEED_MAX


def test_many_random_chunks():
    rng = random.Random(0)
    for _ in range(20):
        chunks = [ChunkDelta(f"req-{rng.random()}",
                             [rng.choice([PLACEHOLDER_TOKEN, rng.randrange(2**31)])
                              for _ in range(rng.choice([0, 1, 1, 1, 7, 300]))],
                             rng.randrange(2**20), rng.randrange(64),
                             [rng.randrange(2**62) for _ in range(rng.choice([0, 0, 0, 1, 12]))],
                             rng.random() < 0.8)
                  for _ in range(rng.randrange(600))]
        new = {c.request_id: SamplingParams(temperature=rng.random() * 2, top_p=rng.random() or 1,
                                            seed=rng.choice([None, rng.randrange(SEED_MIN, SEED_MAX)]))
               for c in chunks if rng.random() < 0.3}
        round_trip(StepBatch(chunks, new, [f"done-{i}" for i in range(rng.randrange(5))]))


def test_rejects_other_messages():
    with pytest.raises((ValueError, struct.error)):
        decode_step(b"shutdown")
    message = encode_step(StepBatch([ChunkDelta("a", [1], 0, 0, [0], True)]))
    with pytest.raises(ValueError):
        decode_step(message[:-1])
    with pytest.raises(ValueError):
        decode_step(message + b"x")
    with pytest.raises(ValueError):
        decode_step(b"XXXX" + message[4:])
    assert HEADER.size % 8 == 0


def test_swaps_out_and_in_with_their_tier():
    batch = StepBatch([ChunkDelta("a", [1], 8, 0, [4, 5, 6], True)], plan="tp2",
                      swap_out=[KVSwap("b", [7, 2**40], 20, 0, 20), KVSwap("é", [3], 1, 20, 1)],
                      swap_in=[KVSwap("a", [4, 5], 8, 64, 8)],
                      swap_tier_path="/dev/shm/tier-ü", swap_tier_tokens=2**33)
    decoded = round_trip(batch)
    assert decoded == batch


def test_no_swaps_decode_as_none():
    decoded = round_trip(StepBatch([ChunkDelta("a", [1], 0, 0, [0], True)]))
    assert (decoded.swap_out, decoded.swap_in, decoded.swap_tier_path) == ([], [], "")
