"""A step message in a fixed binary layout, so that sending a step to the ranks costs
a few bulk operations instead of pickling every chunk, list and request id.

Layout (little-endian), version 8; the counts in the header size every section:
  header          magic b"PSTB", u16 version, u16 reserved (0), then u32 counts:
                  C chunks, T token ids, K new block ids, N new requests, F finished
                  requests, S bytes of id text, B logit-bias entries, P prompt
                  tokens, D plain decodes, E new block ids of plain decodes  (48 bytes)
  int64[3, D]     per plain decode (StepBatch.decode_ids): its start, the blocks it keeps,
                  its number of new blocks
  int64[E]        the plain decodes' new block ids, in order
  int64[T]        every chunk's token ids, in chunk order (PLACEHOLDER_TOKEN as it is)
  int64[K]        every chunk's new block ids, in chunk order
  int64[5, N]     per new request: top_k, logprobs (-1 = None), has_seed, seed (0 = None),
                  length of its prompt sent (-1 = not sent)
  int64[P]        the prompts sent, in request order
  float64[6, N]   per new request: temperature, top_p, min_p, presence_penalty,
                  frequency_penalty, repetition_penalty
  int64[B]        every new request's logit-bias token ids, in request order
  float64[B]      their biases
  int32[5, C]     per chunk: start_pos, blocks_from, len(token_ids), len(new_blocks), samples
  int32[N]        per new request: its number of logit-bias entries
  int32[D+C+N+F+1]  length in characters of each id: the plain decodes' request ids,
                  the chunks', the new requests' ids, the finished ones, then the plan
                  name
  u8[S]           those ids and the plan name, concatenated, UTF-8
  int32[2]        M chunks with a structured-output token mask, W words per mask
  int32[M]        their indices among the chunks
  int32[M, W]     their bitmasks
  int64[1]        the round id of a step every replica sharing FFN weights runs together
                  (-1: none)
  int64[5]        swap preemption: O swaps out, I swaps in, L block ids of them all, the
                  CPU tier's tokens, X bytes of the text below
  int64[4, O+I]   per swap (outs first): num_tokens, slot_start, slot_length, its block ids
  int64[L]        every swap's block ids, in swap order
  int32[O+I+1]    length in characters of each swap's request id, then of the tier's path
  u8[X]           those ids and the path, concatenated, UTF-8
  int64[2]        round_rows, R ranks of round_tokens
  int64[2, R]     round_tokens: its ranks, their token counts
  int64[N]        per new request: prompt_logprobs (-1 = None)

A new request carries only the sampling fields a rank uses (greediness follows from
temperature and top_k) and, where sent, its prompt; its other fields decode to their defaults,
with max_tokens None. A logit bias with no entries decodes as None.
A top_k or logprobs past int64, which no vocabulary reaches, is sent as the int64 maximum.

To add a field, append a section after the last one and bump VERSION: the sections
before it keep their places, and the engine and its ranks always run the same code."""
import math
import struct
from itertools import chain
from operator import attrgetter

import numpy as np

from parashift.sampling_params import SEED_MAX as INT64_MAX, SamplingParams
from parashift.step.message import ChunkDelta, KVSwap, StepBatch
from parashift.structured.matchers import TokenMasks

MAGIC, VERSION = b"PSTB", 9
HEADER = struct.Struct("<4sHH10I")  # 48 bytes, so the int64 sections after it are aligned
_CHUNK = attrgetter("request_id", "token_ids", "start_pos", "blocks_from", "new_blocks",
                    "samples")
_PARAM_INTS = attrgetter("top_k", "logprobs", "seed")
_PARAM_FLOATS_NAMES = ("temperature", "top_p", "min_p", "presence_penalty",
                       "frequency_penalty", "repetition_penalty")
_PARAM_FLOATS = attrgetter(*_PARAM_FLOATS_NAMES)


def _packed(values, dtype, count: int) -> bytes:
    return np.fromiter(values, dtype, count).tobytes()


def _split(values, lengths: np.ndarray) -> list:
    """Cuts a flat list (or a string) into consecutive pieces of the given lengths, with
    fast paths for a decode step's lists: one token per chunk, few chunks with new blocks."""
    ends = np.cumsum(lengths).tolist()
    starts = [0] + ends[:-1]
    if isinstance(values, str):
        return [values[a:b] for a, b in zip(starts, ends)]
    if len(values) == len(lengths) and (lengths == 1).all():
        return [[value] for value in values]
    pieces = [[] for _ in ends]
    for i in np.flatnonzero(lengths).tolist():
        pieces[i] = values[starts[i]:ends[i]]
    return pieces


def encode_step(batch: StepBatch) -> bytes:
    C, new, finished = len(batch.chunks), batch.new_params, batch.finished_request_ids
    ids, tokens, starts, froms, blocks, samples = \
        zip(*map(_CHUNK, batch.chunks)) if C else ((),) * 6
    num_tokens, num_blocks = list(map(len, tokens)), list(map(len, blocks))
    T, K, N, D = sum(num_tokens), sum(num_blocks), len(new), len(batch.decode_ids)
    ids = [*batch.decode_ids, *ids, *new, *finished, batch.plan]
    text = "".join(ids).encode("utf-8", "surrogatepass")
    top_k, logprobs, seeds = zip(*map(_PARAM_INTS, new.values())) if N else ((),) * 3
    prompts = [batch.prompts.get(request_id) for request_id in new]
    P = sum(len(p) for p in prompts if p is not None)
    biases = [p.logit_bias or {} for p in new.values()]
    B = sum(map(len, biases))
    return b"".join((
        HEADER.pack(MAGIC, VERSION, 0, C, T, K, N, len(finished), len(text), B, P, D,
                    sum(map(len, batch.decode_new_blocks.values()))),
        _encode_decodes(batch),
        _packed(chain.from_iterable(tokens), np.int64, T),
        _packed(chain.from_iterable(blocks), np.int64, K),
        _packed(chain((min(k, INT64_MAX) for k in top_k),
                      (-1 if n is None else min(n, INT64_MAX) for n in logprobs),
                      (s is not None for s in seeds), (s or 0 for s in seeds),
                      (-1 if p is None else len(p) for p in prompts)), np.int64, 5 * N),
        _packed(chain.from_iterable(p for p in prompts if p is not None), np.int64, P),
        _packed(chain.from_iterable(zip(*map(_PARAM_FLOATS, new.values()))), np.float64, 6 * N),
        _packed(chain.from_iterable(biases), np.int64, B),
        _packed(chain.from_iterable(b.values() for b in biases), np.float64, B),
        _packed(chain(starts, froms, num_tokens, num_blocks, samples), np.int32, 5 * C),
        _packed(map(len, biases), np.int32, N),
        _packed(map(len, ids), np.int32, len(ids)),
        text,
        _encode_masks(batch.token_masks),
        np.array([batch.round_id], np.int64).tobytes(),
        _encode_swaps(batch),
        np.array([batch.round_rows, len(batch.round_tokens)], np.int64).tobytes(),
        _packed(chain(batch.round_tokens, batch.round_tokens.values()), np.int64,
                2 * len(batch.round_tokens)),
        _packed((-1 if p.prompt_logprobs is None else min(p.prompt_logprobs, INT64_MAX)
                 for p in new.values()), np.int64, N)))


def _encode_decodes(batch: StepBatch) -> bytes:
    D, new = len(batch.decode_ids), batch.decode_new_blocks
    counts = np.zeros(D, np.int64)
    counts[list(new)] = list(map(len, new.values()))
    return b"".join((_packed(chain(batch.decode_starts, batch.decode_blocks), np.int64, 2 * D),
                     counts.tobytes(),
                     _packed(chain.from_iterable(new[i] for i in sorted(new)), np.int64,
                             int(counts.sum()))))


_NO_SWAPS = np.zeros(5, np.int64).tobytes() + np.zeros(1, np.int32).tobytes()


def _encode_swaps(batch: StepBatch) -> bytes:
    swaps = batch.swap_out + batch.swap_in
    if not swaps and not batch.swap_tier_path:
        return _NO_SWAPS
    texts = [s.request_id for s in swaps] + [batch.swap_tier_path]
    text = "".join(texts).encode("utf-8", "surrogatepass")
    blocks = [b for s in swaps for b in s.block_ids]
    return b"".join((
        np.array([len(batch.swap_out), len(batch.swap_in), len(blocks), batch.swap_tier_tokens,
                  len(text)], np.int64).tobytes(),
        _packed(chain((s.num_tokens for s in swaps), (s.slot_start for s in swaps),
                      (s.slot_length for s in swaps), (len(s.block_ids) for s in swaps)),
                np.int64, 4 * len(swaps)),
        _packed(blocks, np.int64, len(blocks)),
        _packed(map(len, texts), np.int32, len(texts)),
        text))


def _encode_masks(masks: TokenMasks | None) -> bytes:
    if masks is None:
        return np.zeros(2, np.int32).tobytes()
    rows, width = masks.bitmask.shape
    return b"".join((np.array([rows, width], np.int32).tobytes(),
                     np.asarray(masks.chunks, np.int32).tobytes(),
                     np.ascontiguousarray(masks.bitmask, np.int32).tobytes()))


def decode_step(message: bytes) -> StepBatch:
    magic, version, _, C, T, K, N, F, S, B, P, D, E = HEADER.unpack_from(message)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a step message of version {VERSION}: {magic!r} v{version}")
    offset = HEADER.size

    def take(dtype, *shape: int) -> np.ndarray:
        nonlocal offset
        array = np.frombuffer(message, dtype, math.prod(shape), offset)
        offset += array.nbytes
        return array.reshape(shape)

    decode_starts, decode_blocks, decode_counts = take(np.int64, 3, D)
    counted = np.flatnonzero(decode_counts).tolist()
    decode_new = dict(zip(counted, _split(take(np.int64, E).tolist(),
                                          decode_counts[counted])))
    decode_starts, decode_blocks = decode_starts.tolist(), decode_blocks.tolist()
    tokens, blocks = take(np.int64, T).tolist(), take(np.int64, K).tolist()
    top_k, logprobs, has_seed, seeds, prompt_lens = take(np.int64, 5, N)
    sent = prompt_lens >= 0
    prompts = _split(take(np.int64, P).tolist(), prompt_lens[sent])
    top_k, logprobs, has_seed, seeds = (v.tolist() for v in (top_k, logprobs, has_seed, seeds))
    floats = take(np.float64, 6, N).tolist()
    bias_ids, bias_values = take(np.int64, B).tolist(), take(np.float64, B).tolist()
    columns = take(np.int32, 5, C)
    bias_counts = take(np.int32, N)
    id_lengths = take(np.int32, D + C + N + F + 1)
    ids = _split(message[offset:offset + S].decode("utf-8", "surrogatepass"), id_lengths)
    decode_ids, ids = ids[:D], ids[D:]
    offset += S
    M, W = take(np.int32, 2).tolist()
    masks = TokenMasks(take(np.int32, M).tolist(), take(np.int32, M, W)) if M else None
    round_id = int(take(np.int64, 1)[0])
    O, I, L, tier_tokens, X = take(np.int64, 5).tolist()
    counts = take(np.int64, 4, O + I)
    swap_blocks = take(np.int64, L).tolist()
    text_lengths = take(np.int32, O + I + 1)
    texts = _split(message[offset:offset + X].decode("utf-8", "surrogatepass"), text_lengths)
    offset += X
    round_rows, R = take(np.int64, 2).tolist()
    round_ranks, round_counts = take(np.int64, 2, R).tolist()
    prompt_logprobs = take(np.int64, N).tolist()
    if offset != len(message):
        raise ValueError(f"a step message of {len(message)} bytes, expected {offset}")
    starts, froms, _, _, samples = columns.tolist()
    chunks = list(map(ChunkDelta, ids[:C], _split(tokens, columns[2]), starts, froms,
                      _split(blocks, columns[3]), samples))
    biases = map(dict, map(zip, _split(bias_ids, bias_counts), _split(bias_values, bias_counts)))
    new_params = {ids[C + i]: SamplingParams(
        **dict(zip(_PARAM_FLOATS_NAMES, column)), top_k=top_k[i],
        seed=seeds[i] if has_seed[i] else None, logit_bias=bias or None,
        logprobs=None if logprobs[i] < 0 else logprobs[i], max_tokens=None,
        prompt_logprobs=None if prompt_logprobs[i] < 0 else prompt_logprobs[i])
        for i, column, bias in zip(range(N), zip(*floats), biases)}
    prompted = [r for r, was_sent in zip(ids[C:C + N], sent.tolist()) if was_sent]
    num_tokens, slot_starts, slot_lengths, _ = counts.tolist()
    swaps = list(map(KVSwap, texts[:-1], _split(swap_blocks, counts[3]), num_tokens, slot_starts,
                     slot_lengths))
    return StepBatch(chunks, new_params, ids[C + N:C + N + F], ids[-1],
                     dict(zip(prompted, prompts)), masks, round_id, swaps[:O], swaps[O:],
                     texts[-1], tier_tokens, round_rows, dict(zip(round_ranks, round_counts)),
                     decode_ids, decode_starts, decode_blocks, decode_new)
