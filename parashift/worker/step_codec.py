"""A step message in a fixed binary layout, so that sending a step to the ranks costs
a few bulk operations instead of pickling every chunk, list and request id.

Layout (little-endian), version 1; the counts in the header size every section:
  header          magic b"PSTB", u16 version, u16 reserved (0), then u32 counts:
                  C chunks, T token ids, K new block ids, N new requests, F finished
                  requests, S bytes of id text                               (32 bytes)
  int64[T]        every chunk's token ids, in chunk order (PLACEHOLDER_TOKEN as it is)
  int64[K]        every chunk's new block ids, in chunk order
  int64[4, N]     per new request: top_k, logprobs (-1 = None), has_seed, seed (0 = None)
  float64[3, N]   per new request: temperature, top_p, min_p
  int32[5, C]     per chunk: start_pos, blocks_from, len(token_ids), len(new_blocks), samples
  int32[C+N+F+1]  length in characters of each id: the chunks' request ids, the new
                  requests' ids, the finished ones, then the plan name
  u8[S]           those ids and the plan name, concatenated, UTF-8
  int32[2]        M chunks with a structured-output token mask, W words per mask
  int32[M]        their indices among the chunks
  int32[M, W]     their bitmasks

A new request carries only the sampling fields a rank uses (greediness follows from
temperature and top_k); its other fields decode to their defaults, with max_tokens None.
A top_k or logprobs past int64, which no vocabulary reaches, is sent as the int64 maximum.

To add a field, append a section after the last one and bump VERSION: the sections
before it keep their places, and the engine and its ranks always run the same code."""
import math
import struct
from itertools import chain
from operator import attrgetter

import numpy as np

from parashift.sampling_params import SEED_MAX as INT64_MAX, SamplingParams
from parashift.structured.matchers import TokenMasks
from parashift.worker.step_batch import ChunkDelta, StepBatch

MAGIC, VERSION = b"PSTB", 2
HEADER = struct.Struct("<4sHH6I")  # 32 bytes, so the int64 sections after it are aligned
_CHUNK = attrgetter("request_id", "token_ids", "start_pos", "blocks_from", "new_blocks",
                    "samples")
_PARAM_INTS = attrgetter("top_k", "logprobs", "seed")
_PARAM_FLOATS = attrgetter("temperature", "top_p", "min_p")


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
    T, K, N = sum(num_tokens), sum(num_blocks), len(new)
    ids = [*ids, *new, *finished, batch.plan]
    text = "".join(ids).encode("utf-8", "surrogatepass")
    top_k, logprobs, seeds = zip(*map(_PARAM_INTS, new.values())) if N else ((),) * 3
    return b"".join((
        HEADER.pack(MAGIC, VERSION, 0, C, T, K, N, len(finished), len(text)),
        _packed(chain.from_iterable(tokens), np.int64, T),
        _packed(chain.from_iterable(blocks), np.int64, K),
        _packed(chain((min(k, INT64_MAX) for k in top_k),
                      (-1 if n is None else min(n, INT64_MAX) for n in logprobs),
                      (s is not None for s in seeds), (s or 0 for s in seeds)), np.int64, 4 * N),
        _packed(chain.from_iterable(zip(*map(_PARAM_FLOATS, new.values()))), np.float64, 3 * N),
        _packed(chain(starts, froms, num_tokens, num_blocks, samples), np.int32, 5 * C),
        _packed(map(len, ids), np.int32, len(ids)),
        text,
        _encode_masks(batch.token_masks)))


def _encode_masks(masks: TokenMasks | None) -> bytes:
    if masks is None:
        return np.zeros(2, np.int32).tobytes()
    rows, width = masks.bitmask.shape
    return b"".join((np.array([rows, width], np.int32).tobytes(),
                     np.asarray(masks.chunks, np.int32).tobytes(),
                     np.ascontiguousarray(masks.bitmask, np.int32).tobytes()))


def decode_step(message: bytes) -> StepBatch:
    magic, version, _, C, T, K, N, F, S = HEADER.unpack_from(message)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a step message of version {VERSION}: {magic!r} v{version}")
    offset = HEADER.size

    def take(dtype, *shape: int) -> np.ndarray:
        nonlocal offset
        array = np.frombuffer(message, dtype, math.prod(shape), offset)
        offset += array.nbytes
        return array.reshape(shape)

    tokens, blocks = take(np.int64, T).tolist(), take(np.int64, K).tolist()
    top_k, logprobs, has_seed, seeds = take(np.int64, 4, N).tolist()
    temperature, top_p, min_p = take(np.float64, 3, N).tolist()
    columns = take(np.int32, 5, C)
    id_lengths = take(np.int32, C + N + F + 1)
    ids = _split(message[offset:offset + S].decode("utf-8", "surrogatepass"), id_lengths)
    offset += S
    M, W = take(np.int32, 2).tolist()
    masks = TokenMasks(take(np.int32, M).tolist(), take(np.int32, M, W)) if M else None
    if offset != len(message):
        raise ValueError(f"a step message of {len(message)} bytes, expected {offset}")
    starts, froms, _, _, samples = columns.tolist()
    chunks = list(map(ChunkDelta, ids[:C], _split(tokens, columns[2]), starts, froms,
                      _split(blocks, columns[3]), map(bool, samples)))
    new_params = {ids[C + i]: SamplingParams(
        temperature=temperature[i], top_p=top_p[i], top_k=top_k[i], min_p=min_p[i],
        seed=seeds[i] if has_seed[i] else None,
        logprobs=None if logprobs[i] < 0 else logprobs[i], max_tokens=None) for i in range(N)}
    return StepBatch(chunks, new_params, ids[C + N:C + N + F], ids[-1], masks)
