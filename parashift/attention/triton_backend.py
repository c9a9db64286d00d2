"""Attention over the paged KV pool with Triton kernels (CUDA).

`attend` takes decode, prefill and mixed batches through one kernel (at most
two launches: the decodes at the head of the batch, with a small query tile,
and the rest). Launch shapes come from tensor shapes and the metadata's
Python ints, never from tensor values, so a step runs without host syncs and
can be captured in a CUDA graph. A captured graph keeps the split count
chosen at capture (for max_model_len); a decode launch's sequences take only the splits their
context needs, on the device (`triton_decode`, `CONTEXT_SPLITS`).

Batch-invariant (deterministic mode): every launch takes the prefill configuration's KV
tile and the masked tile loop for every KV tile (MASK_EVERY_TILE), so a query row's tiles,
their order, the tile shapes of its dots and the code that runs them are the same in decode,
prefill and chunked prefill, whatever the batch; tiles past its position are masked to exact
no-ops. Prefill launches take the prefill configuration's 128 query rows per program, decode
launches 16 (`invariant_decode_config`): the softmax denominator is summed on the tensor
cores (ROW_SUM_BY_DOT) so that a row's bits do not follow the rows per program
(PARASHIFT_DETERMINISTIC_DECODE_ATTENTION=prefill runs decodes in the prefill configuration;
PARASHIFT_DETERMINISTIC_ATTENTION_BLOCK_M=64 takes fewer rows for every launch). The
context is cut into fixed partitions of INVARIANT_PARTITION tokens, each summed from a fresh
softmax state, and the partitions' states are merged in position order by one arithmetic: a
decode launch spreads them over programs (split-KV, any count) and a reduction merges them,
a prefill program merges them itself, and a row's bits are the same either way. fp32 dots
are IEEE."""
import bisect
import math
import os
from dataclasses import dataclass

import torch
import triton

from parashift.attention.metadata import AttentionMetadata
from parashift.attention import triton_decode_preload
from parashift.attention.triton_decode import decode_attention_kernel
from parashift.attention.triton_kernels import (paged_attention_kernel,
                                                reduce_partitions_kernel, reduce_splits_kernel,
                                                write_kv_kernel)
from parashift.engine_switches import switch
from parashift.kernels import num_sms, pdl, rotary, split_tickets

# Split-KV targets about this many programs per SM, and gives each split at
# least MIN_SPLIT_TOKENS of context.
PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 32
# Decode launches (outside deterministic mode) of at most FUSED_MAX_SPLITS splits run
# `triton_decode`'s one-launch kernel: its split reduction in the split programs, a
# sequence's splits at most ceil(context / FUSED_SPLIT_TOKENS) on the device.
# PARASHIFT_ATTN_FUSED_REDUCE=0 takes the split kernel and its reduction launch for every
# decode launch (read when the backend is made). On an H200, 8B
# heads, in graphs captured for 8,192 tokens (benchmarks/decode_attention_sweep.py, session
# 44): b8 (8 splits) 17.1 / 71.5 / 256 µs a layer against 21.5 / 98.8 / 361 at contexts
# 1k / 8k / 32k, b64 (one split) 67.0 against 71.0 at 1k, b256 254 against 266; but b1 (32
# splits) 14.7 against 9.0 at 1k: the merge's loads, one split after another, cost more than
# the reduction's launch there.
FUSED_REDUCE_ENV = "PARASHIFT_ATTN_FUSED_REDUCE"
# Decode launches that keep the split kernel and its reduction (more than FUSED_MAX_SPLITS
# splits: batches of 1-4 on the 8B shape) run `triton_decode_preload`'s split kernel, its
# metadata and first KV tile loaded before its PDL wait; PARASHIFT_ATTN_PRELOAD=0: the split
# kernel of the other launches (read at each such launch's plan: a graph keeps its capture's)
PRELOAD_ENV = "PARASHIFT_ATTN_PRELOAD"
# ... and where a step is such decodes only, RoPE (with the q/k norms) and the KV write run in
# that kernel too (`rotate_and_attend`): one launch less a layer; PARASHIFT_ATTN_ROPE=0: the
# rotary kernel before it (read at each such step's plan). On an H200, 8B FP8 decode chain at
# one row (context 1,024, graphs for 2,048, PDL on; benchmarks/fp8_chain_variants.py, session
# 45): 76.7 µs a layer against 78.6 with the rotary kernel, 79.4 without preloading
ROPE_ENV = "PARASHIFT_ATTN_ROPE"
# Such one-row decode launches cut a sequence's context among its splits by KV tiles, so their
# grid takes splits of one tile (by max_model_len, up to MAX_SPLITS) rather than of
# MIN_SPLIT_TOKENS: graphs captured for 2,048 tokens had 16 splits, and a context of 1,025-2,048
# tokens ran two tiles a split, the second loaded after the PDL wait (a graph for 4,096 or more
# already had 32). PARASHIFT_ATTN_SPLIT_TOKENS=N: splits of at least N tokens instead (128: as
# before; read at each such launch's plan)
SPLIT_TOKENS_ENV = "PARASHIFT_ATTN_SPLIT_TOKENS"
# Their split reduction reads its metadata before its PDL wait where the small kernels load
# early (PARASHIFT_PDL_EARLY_LOADS); PARASHIFT_ATTN_REDUCE_EARLY=0: after it, as before (read
# at each launch)
REDUCE_EARLY_ENV = "PARASHIFT_ATTN_REDUCE_EARLY"
REDUCE_WARPS = 4  # the split reduction's, a program a (row, head)
FUSED_MAX_SPLITS = 8
FUSED_SPLIT_TOKENS = MIN_SPLIT_TOKENS
# ... unsplit from this many programs an SM (rows x KV heads): on an H200, 8B heads, batch 64
# (512 programs) at context 1,024, one split took 65.8 µs a layer against two's 72.5
FUSED_UNSPLIT_PROGRAMS_PER_SM = 2
# ... its grid (KV heads, rows, splits) rather than (rows, KV heads, splits)
FUSED_HEADS_FIRST = False
# Decode launches over an FP8 pool read its values as 16-bit pairs (triton_fp8_values.py):
# the one-launch kernel's, and the preloading split kernel's at one row
# (PARASHIFT_ATTN_FP8_PAIRS=0: a byte at a time, as before; read at each launch: a graph keeps
# its capture's). On an H200, 8B heads (benchmarks/decode_attention_ceiling.py, session 47):
# b64 x 1,040 tokens 91.8 -> 67.6 µs a layer, b256 294.8 -> 233.6, b8 x 32k 331.6 -> 243.5;
# the preloading kernel b1 x 32k 46.4 -> 42.1, b1 x 128k 167.3 -> 147.6, but b4 x 32k / 128k
# 167.6 -> 188.5 / 647.8 -> 729.2 (so one row only)
FP8_PAIRS_ENV = "PARASHIFT_ATTN_FP8_PAIRS"
PAIRS_TWO_STAGE_PROGRAMS = 8  # ... in 2 stages from this many programs an SM, else 3
# ... and the one-launch kernel's products in fp16 where q is bf16 (one conversion from E4M3
# instead of two; q clamped to fp16's range; PARASHIFT_ATTN_FP8_F16=0: in bf16): with pairs,
# b64 67.6 -> 50.9 µs, b256 233.6 -> 175.1, b8 x 32k 243.5 -> 180.2
FP8_F16_ENV = "PARASHIFT_ATTN_FP8_F16"
# Upper bound on the fp32 partial buffer of split-KV, in bytes.
MAX_PARTIAL_BYTES = 64 << 20
# Deterministic mode: query rows per program, when set, below the prefill configuration's
# (fewer wasted rows on decode batches, a slower prefill)
INVARIANT_BLOCK_M = int(os.environ.get("PARASHIFT_DETERMINISTIC_ATTENTION_BLOCK_M", "0")) or None
# Deterministic mode: the KV tile (tokens) of every launch, when set, instead of the prefill
# configuration's (a tuning knob: a decode reads its context in whole tiles)
INVARIANT_TILE_N = int(os.environ.get("PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N", "0")) or None
if INVARIANT_TILE_N is not None and (INVARIANT_TILE_N < 16 or 128 % INVARIANT_TILE_N):
    raise ValueError("PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N must be 16, 32, 64 or 128, not "
                     f"{INVARIANT_TILE_N}")
# Deterministic mode: the context's fixed partitions (tokens; a multiple of every
# configuration's KV tile), each a fresh softmax state, merged in order: decode launches
# may then spread a row's partitions over programs (split-KV) without changing its bits. On
# an H200 (8B shape, context 512, unsplit rows merged in program) 128 tokens
# took the decode step to 1.10x / 1.14x / 1.20x the default mode at batch 1 / 64 / 256,
# against 1,024's 1.16x / 1.11x / 1.22x; prefill 4,096 1.23x against 1.20x (twenty-fifth
# session, docs/benchmark_log.md)
INVARIANT_PARTITION = int(os.environ.get("PARASHIFT_DETERMINISTIC_ATTENTION_PARTITION", "128"))
# ... whose partial states a decode launch stores (and a reduction merges) up to this many
# bytes; above, each program merges its partitions in registers (a second accumulator: on an
# H100 that spills, 8B batch 64 at 2048 tokens 20% slower)
MAX_INVARIANT_PARTIAL_BYTES = 256 << 20
# ... unless the launch is not split (one program takes all of a row's partitions: large
# batches): then, with `program` (the default), that program merges them itself, with no
# partial states stored and no reduction launched; `reduction` stores them all the same. On
# an H200, 8B shape, context 512, 5 partitions, `program` took the deterministic decode step
# from 15.66 to 15.38 ms at batch 256 and 7.21 to 7.09 at 64 (twenty-fifth session)
INVARIANT_UNSPLIT_MERGE = os.environ.get("PARASHIFT_DETERMINISTIC_UNSPLIT_MERGE", "program")
if INVARIANT_UNSPLIT_MERGE not in ("program", "reduction"):
    raise ValueError("PARASHIFT_DETERMINISTIC_UNSPLIT_MERGE must be program or reduction, not "
                     f"{INVARIANT_UNSPLIT_MERGE!r}")
# Deterministic mode: decode launches in a configuration of few query rows per program
# ("small") or in the prefill one ("prefill", 128 rows of which a decode fills its group's)
INVARIANT_DECODE = os.environ.get("PARASHIFT_DETERMINISTIC_DECODE_ATTENTION", "small")
INVARIANT_DECODE_MODES = ("small", "prefill")


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    tile_n: int
    num_warps: int
    num_stages: int


def decode_config(head_dim: int, group_p: int, elem_size: int) -> KernelConfig:
    row_bytes = head_dim * elem_size
    tile_n = 64 if row_bytes <= 256 else 32 if row_bytes <= 512 else 16
    return KernelConfig(max(16, group_p), tile_n, num_warps=4,
                        num_stages=3 if elem_size <= 2 else 2)


def fused_decode_config(head_dim: int, group_p: int, elem_size: int, rows: int,
                        pairs: bool = False, programs_per_sm: float = 0.0) -> KernelConfig:
    """The one-launch decode kernel's for `rows` decodes: one query row per head of the
    group, two stages (on an H200, 8B heads, context 1,024, one split: 65.8 against three
    stages' 67.1 µs at batch 64, 246 against 252 at 256; KV tiles of 32 or 16 tokens
    slower; benchmarks/decode_attention_sweep.py --configs, session 44); over an FP8 pool read
    as pairs (`pairs`), three where the launch has fewer than PAIRS_TWO_STAGE_PROGRAMS programs
    an SM (the next tiles' block table entries loaded a tile earlier: on an H200, 8B heads,
    67.5 against 80.4 µs at b64 x 1,040 and 243.7 against 295.0 at b8 x 32k, ~3.9 programs an
    SM each; at b256 x 1,040, 15.5 an SM, 244.6 against 234.0; session 47, helper attn64)."""
    config = decode_config(head_dim, group_p, elem_size)
    stages = min(2, config.num_stages)
    if pairs and programs_per_sm < PAIRS_TWO_STAGE_PROGRAMS:
        stages = 3
    return KernelConfig(config.block_m, config.tile_n, config.num_warps, stages)


def fused_reduce_enabled() -> bool:
    return switch(FUSED_REDUCE_ENV, "1")


def fp8_pairs(v_cache: torch.Tensor, head_dim: int) -> bool:
    """Whether a decode launch reads v_cache's FP8 values as pairs (FP8_PAIRS_ENV): a head of
    a power of two of at least 32 dimensions (each product's width at least 16)."""
    return (v_cache.element_size() == 1 and head_dim >= 32
            and head_dim == triton.next_power_of_2(head_dim) and switch(FP8_PAIRS_ENV, "1"))


def fp8_f16(q: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the one-launch kernel's FP8-pair products run in fp16 (FP8_F16_ENV)."""
    return (q.dtype == torch.bfloat16 and fp8_pairs(v_cache, q.shape[2])
            and switch(FP8_F16_ENV, "1"))


def preload_enabled() -> bool:
    return switch(PRELOAD_ENV, "1")


def prefill_config(head_dim: int, group_p: int, elem_size: int) -> KernelConfig:
    row_bytes = head_dim * elem_size
    if row_bytes <= 256:
        block_m, tile_n, warps, stages = 128, 128, 8, 3
    elif row_bytes <= 512:
        block_m, tile_n, warps, stages = 64, 32, 4, 2
    else:
        block_m, tile_n, warps, stages = 64, 16, 4, 1
    return KernelConfig(max(block_m, group_p), tile_n, warps, stages)


def invariant_config(head_dim: int, group_p: int, elem_size: int,
                     block_m: int | None) -> KernelConfig:
    """The one configuration of every batch-invariant launch, decode and prefill alike: the
    prefill one, its query rows per program capped at block_m if given, its KV tile
    INVARIANT_TILE_N tokens if set."""
    config = prefill_config(head_dim, group_p, elem_size)
    if INVARIANT_TILE_N is not None:
        config = KernelConfig(config.block_m, INVARIANT_TILE_N, config.num_warps,
                              config.num_stages)
    if block_m is None or block_m >= config.block_m:
        return config
    return KernelConfig(max(block_m, group_p), config.tile_n, num_warps=4,
                        num_stages=config.num_stages)


def invariant_decode_config(head_dim: int, group_p: int, elem_size: int,
                            block_m: int | None) -> KernelConfig:
    """Batch-invariant decode launches: one query row per head of a KV head's group, over
    the invariant configuration's KV tiles (the partitions and the tiles' dot chains stay
    the same: only which program computes a row changes). Two stages, not the prefill's
    three: on an H200 (8B heads, batch 256, context 1,024) 265 against 271 µs, the same
    bits (`benchmarks/attention_kernels.py --invariant-sweep`, thirtieth session)."""
    config = invariant_config(head_dim, group_p, elem_size, block_m)
    return KernelConfig(min(config.block_m, max(16, group_p)), config.tile_n, num_warps=4,
                        num_stages=min(2, config.num_stages))


def choose_num_splits(num_programs: int, max_seq_len: int, partial_bytes_per_split: int,
                      num_sms: int, min_split_tokens: int = MIN_SPLIT_TOKENS) -> int:
    """Enough splits to give every SM work, none shorter than `min_split_tokens`;
    a power of two, so few variants of the reduce kernel get compiled."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(num_programs, 1))
    by_length = triton.cdiv(max_seq_len, min_split_tokens)
    by_memory = MAX_PARTIAL_BYTES // max(partial_bytes_per_split, 1)
    splits = min(wanted, by_length, by_memory, MAX_SPLITS)
    return 1 if splits <= 1 else 1 << (splits.bit_length() - 1)


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, batch_invariant: bool = False,
                 invariant_block_m: int | None = INVARIANT_BLOCK_M,
                 invariant_partition: int = INVARIANT_PARTITION,
                 invariant_decode: str = INVARIANT_DECODE):
        if invariant_block_m is not None and (invariant_block_m < 16
                                              or invariant_block_m & (invariant_block_m - 1)):
            raise ValueError("the batch-invariant attention's query rows per program must be "
                             f"a power of two of at least 16, not {invariant_block_m}")
        if invariant_partition % 128:
            raise ValueError("the batch-invariant attention's partition must be a multiple of "
                             f"128 tokens (every configuration's KV tile), not "
                             f"{invariant_partition}")
        if invariant_decode not in INVARIANT_DECODE_MODES:
            raise ValueError(f"the batch-invariant decode attention is one of "
                             f"{INVARIANT_DECODE_MODES}, not {invariant_decode!r}")
        self.batch_invariant = batch_invariant
        self.invariant_decode = invariant_decode
        self.invariant_block_m = invariant_block_m
        self.invariant_partition = invariant_partition
        self.fused_reduce = fused_reduce_enabled()  # read once, as a captured graph keeps it

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        num_tokens, num_kv_heads, head_dim = k.shape
        if num_tokens == 0:
            return
        k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
        _check_cache(k_cache, v_cache)
        write_kv_kernel[(num_tokens,)](
            k, v, k_cache, v_cache, meta.slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            *k_cache.stride()[:3], *v_cache.stride()[:3],
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
            HEADS_P=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM_P=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1])

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return self._attend(q, k_cache, v_cache, meta, scale)

    def _attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                launches: list | None = None) -> torch.Tensor:
        """`attend`, with the step's launches (sequences, plan) where already planned."""
        num_tokens, num_heads, head_dim = q.shape
        if num_heads % k_cache.shape[2]:
            raise ValueError(f"{num_heads} query heads do not share {k_cache.shape[2]} "
                             "KV heads evenly")
        real_tokens = num_tokens
        if not meta.static_shape:
            real_tokens = meta.query_start_loc_cpu[-1] if meta.num_seqs else 0
            if real_tokens == 0:
                return torch.zeros_like(q)
        if launches is None:
            launches = [(seqs, self._plan(q, k_cache, meta, seqs))
                        for seqs in _split_decodes(meta, num_tokens)]
        if meta.static_shape:
            # Rows of no sequence must be zero, and which they are is known on the device
            # only: the split reduction writes their zeros, else a fill does.
            reduced = all(launch.zeroes_padding for _, launch in launches)
            out = torch.empty_like(q) if reduced else torch.zeros_like(q)
        else:
            out = torch.empty_like(q)
            if real_tokens < num_tokens:
                out[real_tokens:].zero_()
        q = _last_dim_contiguous(q)
        _check_cache(k_cache, v_cache)
        for seqs, launch in launches:
            _launch_attention(out, q, k_cache, v_cache, meta, scale, seqs, launch)
        return out

    def rotate_and_attend(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, cos_sin: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                          norms: tuple | None = None) -> torch.Tensor:
        """`attend` of q after kernels/rotary.py's rotate_and_write_kv (q, k, v before RoPE;
        norms: the q and k RMS norms' weights and eps, or None): in the preloading split
        kernel where the step's rows are all decodes it runs (`rope_launch`), else the rotary
        kernel, then `attend`."""
        launch = self.rope_launch(q, k_cache, meta)
        if launch is None or not launch[1].preload:
            q = rotary.rotate_and_write_kv(positions, q, k, v, cos_sin, k_cache, v_cache,
                                           meta.slot_mapping, norms)
            if launch is None:  # `attend`: a subclass's routes (cuDNN's long prompts) hold
                return self.attend(q, k_cache, v_cache, meta, scale)
            return self._attend(q, k_cache, v_cache, meta, scale, [launch])
        _check_cache(k_cache, v_cache)
        rope = triton_decode_preload.Rope(
            _last_dim_contiguous(k), _last_dim_contiguous(v), positions, cos_sin.contiguous(),
            meta.slot_mapping, norms)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _launch_attention(out, _last_dim_contiguous(q), k_cache, v_cache, meta, scale,
                          *launch, rope)
        return out

    def rope_launch(self, q: torch.Tensor, k_cache: torch.Tensor,
                    meta: AttentionMetadata) -> "tuple[_SeqRange, _Launch] | None":
        """The one launch of a step of decodes only, which takes RoPE and the KV write where
        it is the preloading kernel's (PARASHIFT_ATTN_ROPE on); None for other steps."""
        if (self.batch_invariant or meta.max_query_len > 1 or q.shape[0] == 0
                or (not meta.static_shape and meta.query_start_loc_cpu[-1] == 0)
                or not switch(ROPE_ENV, "1")):
            return None
        (seqs,) = _split_decodes(meta, q.shape[0])
        return seqs, self._plan(q, k_cache, meta, seqs)

    def attend_seqs(self, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    first: int, end: int) -> None:
        """Writes the rows of sequences [first, end) of an eager step (not a CUDA graph's)
        into `out`; q's last dimension contiguous."""
        _check_cache(k_cache, v_cache)
        for seqs in _split_decodes(meta, meta.query_start_loc_cpu[-1], first, end):
            _launch_attention(out, q, k_cache, v_cache, meta, scale, seqs,
                              self._plan(q, k_cache, meta, seqs))

    def warm_up(self, num_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                dtype: torch.dtype) -> int:
        """Compiles every attention variant a step can launch over this cache with
        `num_heads` query heads per rank: the decode and the prefill config, each at every
        split count. Otherwise the first steps to need one wait for Triton's compiler
        (seconds each) while requests queue. Returns the number of launches."""
        _check_cache(k_cache, v_cache)
        device, head_dim = k_cache.device, k_cache.shape[3]
        launches = 0
        for decode, q_len in ((True, 1), (False, 2)):
            meta = AttentionMetadata(
                slot_mapping=torch.full((q_len,), -1, dtype=torch.int64, device=device),
                query_start_loc=torch.tensor([0, q_len], dtype=torch.int32, device=device),
                seq_lens=torch.tensor([q_len], dtype=torch.int32, device=device),
                block_tables=torch.zeros(1, 1, dtype=torch.int32, device=device),
                query_start_loc_cpu=[0, q_len], seq_lens_cpu=[q_len], max_query_len=q_len,
                max_seq_len=q_len, block_size=k_cache.shape[1])
            q = torch.zeros(q_len, num_heads, head_dim, dtype=dtype, device=device)
            out = torch.zeros_like(q)
            seqs = _SeqRange(0, 1, 0, q_len, decode=decode)
            for splits in self._split_counts():
                launch = self._plan(q, k_cache, meta, seqs, num_splits=splits)
                _launch_attention(out, q, k_cache, v_cache, meta, 1.0, seqs, launch)
                launches += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return launches

    def _plan(self, q, k_cache, meta, seqs, num_splits: int | None = None) -> "_Launch":
        if self.batch_invariant:
            return _plan_invariant_launch(q, k_cache, meta, seqs, num_splits,
                                          self.invariant_block_m, self.invariant_partition,
                                          small_decode=self.invariant_decode == "small")
        return _plan_launch(q, k_cache, meta, seqs, num_splits, self.fused_reduce)

    def _split_counts(self) -> list[int]:
        """Split counts to compile: invariant launches compile one split variant for all."""
        return [1, 2] if self.batch_invariant else [1 << i for i in range(MAX_SPLITS.bit_length())]


@dataclass(frozen=True)
class _SeqRange:
    """Sequences [first, end) of the step, launched together; the grid covers
    query rows [token_offset, token_offset + num_tokens)."""
    first: int
    end: int
    token_offset: int
    num_tokens: int
    decode: bool


def _split_decodes(meta: AttentionMetadata, num_tokens: int, first: int = 0,
                   end: int | None = None) -> list[_SeqRange]:
    """Sequences [first, end) (all by default; the last one's rows run to `num_tokens`):
    leading one-token sequences (decodes) run with the small-M decode config, the rest
    with the prefill config. Any split is correct; this one is fast when the scheduler
    puts decodes first."""
    starts = meta.query_start_loc_cpu
    end = meta.num_seqs if end is None else end
    last_row = num_tokens if end == meta.num_seqs else starts[end]
    if meta.max_query_len <= 1:
        return [_SeqRange(first, end, starts[first], last_row - starts[first], decode=True)]
    # starts[i] - i stays starts[first] - first while every sequence so far has one query row
    offset = starts[first] - first
    decodes_end = bisect.bisect_right(range(first, end + 1), offset,
                                      key=lambda i: starts[i] - i) - 1 + first
    decodes = _SeqRange(first, decodes_end, starts[first], starts[decodes_end] - starts[first],
                        decode=True)
    if decodes_end == end:
        return [decodes]
    prefill = _SeqRange(decodes_end, end, starts[decodes_end], last_row - starts[decodes_end],
                        decode=False)
    if decodes_end == first:
        return [prefill]
    return [decodes, prefill]


@dataclass(frozen=True)
class _Launch:
    config: KernelConfig
    group: int
    group_p: int
    block_q: int
    num_q_blocks: int
    num_splits: int
    invariant: bool
    partition_tiles: int = 0  # invariant: tiles per fixed KV partition
    max_partitions: int = 1   # invariant and split: partitions the partial buffers hold
    # invariant: programs store each partition's state for the reduction even unsplit (one
    # accumulator per program instead of a running one beside each partition's)
    stores_partials: bool = False
    # decode in one launch (triton_decode): a program per (row, KV head, split)
    fused: bool = False
    # two-launch decodes of one row a sequence: a sequence takes the splits of at least this
    # many tokens its context needs, the other programs exit (0: every split)
    context_splits: int = 0
    # ... and their split kernel `triton_decode_preload`'s
    preload: bool = False

    @property
    def partials(self) -> bool:
        """Programs store partial states that a reduction merges."""
        return self.num_splits > 1 or self.stores_partials

    @property
    def zeroes_padding(self) -> bool:
        """The launch writes zeros to its rows of no sequence (else a fill must)."""
        return self.partials or self.fused


def _shape(q, k_cache) -> tuple[int, int, int, int]:
    """(query heads, head_dim, query heads per KV head, that rounded up to a power of 2)."""
    num_heads, head_dim = q.shape[1:]
    group = num_heads // k_cache.shape[2]
    return num_heads, head_dim, group, triton.next_power_of_2(group)


def _plan_launch(q, k_cache, meta: AttentionMetadata, seqs: _SeqRange,
                 num_splits: int | None = None, fused_reduce: bool = True) -> _Launch:
    num_heads, head_dim, group, group_p = _shape(q, k_cache)
    elem_size = max(q.element_size(), k_cache.element_size())
    one_row_decodes = fused_reduce and _one_row_decodes(meta, seqs)
    if one_row_decodes:
        fused = _plan_fused_decode(q, k_cache, meta, seqs, num_splits, head_dim, group,
                                   group_p, elem_size)
        if fused is not None:
            return fused
    config = (decode_config if seqs.decode else prefill_config)(head_dim, group_p, elem_size)
    block_q = max(1, config.block_m // group_p)
    num_q_blocks = seqs.num_tokens // block_q + seqs.end - seqs.first
    partial_bytes = seqs.num_tokens * num_heads * (head_dim + 2) * 4
    if num_splits is None:
        num_splits = choose_num_splits(num_q_blocks * k_cache.shape[2], meta.max_seq_len,
                                       partial_bytes, num_sms(q.device),
                                       _split_tokens(config) if one_row_decodes
                                       else MIN_SPLIT_TOKENS)
    context_splits = config.tile_n if one_row_decodes and num_splits > 1 else 0
    preload = context_splits > 0 and preload_enabled()
    return _Launch(config, group, group_p, block_q, num_q_blocks, num_splits, False,
                   context_splits=context_splits, preload=preload)


def _split_tokens(config: KernelConfig) -> int:
    """The least tokens of a split of a one-row decode launch: a KV tile (SPLIT_TOKENS_ENV)."""
    value = os.environ.get(SPLIT_TOKENS_ENV, "")
    if not value:
        return config.tile_n
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{SPLIT_TOKENS_ENV}={value!r}: expected a positive token count")
    return int(value)


def _one_row_decodes(meta: AttentionMetadata, seqs: _SeqRange) -> bool:
    """Decodes of one query row each (rows of no sequence after them): the one-launch
    kernel's (up to FUSED_MAX_SPLITS splits), else the split kernel's with each sequence's
    splits from its context (where PARASHIFT_ATTN_FUSED_REDUCE is on)."""
    starts = meta.query_start_loc_cpu
    return seqs.decode and starts[seqs.end] - starts[seqs.first] == seqs.end - seqs.first


def _plan_fused_decode(q, k_cache, meta: AttentionMetadata, seqs: _SeqRange,
                       num_splits: int | None, head_dim: int, group: int, group_p: int,
                       elem_size: int) -> "_Launch | None":
    """A program per (row, KV head, split); None where its splits are more than
    FUSED_MAX_SPLITS or need ticket counters this device has not made (a CUDA graph capture
    before any eager step)."""
    rows = max(seqs.num_tokens, 1)
    programs, sms = rows * k_cache.shape[2], num_sms(q.device)
    if num_splits is None and programs >= FUSED_UNSPLIT_PROGRAMS_PER_SM * sms:
        num_splits = 1
    if num_splits is None:
        partial_bytes = rows * q.shape[1] * (head_dim + 2) * 4
        num_splits = choose_num_splits(programs, meta.max_seq_len, partial_bytes, sms)
    if num_splits > FUSED_MAX_SPLITS or (num_splits > 1
                                         and _tickets(q.device, programs) is None):
        return None
    config = fused_decode_config(head_dim, group_p, elem_size, rows,
                                 fp8_pairs(k_cache, head_dim), programs * num_splits / sms)
    return _Launch(config, group, group_p, 1, rows, num_splits, False, fused=True)


def _tickets(device: torch.device, tiles: int) -> torch.Tensor | None:
    return split_tickets.counters(device, tiles, pool="attention")


def _plan_invariant_launch(q, k_cache, meta: AttentionMetadata, seqs: _SeqRange,
                           num_splits: int | None, block_m: int | None,
                           partition: int, small_decode: bool = False) -> _Launch:
    """One configuration for every prefill launch, one of few rows for decodes (with
    `small_decode`); a decode launch may spread each row's fixed partitions over programs
    (a row's bits are the same either way)."""
    num_heads, head_dim, group, group_p = _shape(q, k_cache)
    elem_size = max(q.element_size(), k_cache.element_size())
    configure = invariant_decode_config if small_decode and seqs.decode else invariant_config
    config = configure(head_dim, group_p, elem_size, block_m)
    block_q = max(1, config.block_m // group_p)
    num_q_blocks = seqs.num_tokens // block_q + seqs.end - seqs.first
    partitions = triton.cdiv(meta.max_seq_len, partition)
    partial_bytes = seqs.num_tokens * num_heads * (head_dim + 2) * 4 * partitions
    stores = seqs.decode and partial_bytes <= MAX_INVARIANT_PARTIAL_BYTES
    if num_splits is None:
        num_splits = 1
        if stores:
            wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms(q.device),
                                 num_q_blocks * k_cache.shape[2])
            num_splits = max(1, min(wanted, partitions, MAX_SPLITS))
    stores = stores and (num_splits > 1 or INVARIANT_UNSPLIT_MERGE == "reduction")
    return _Launch(config, group, group_p, block_q, num_q_blocks, num_splits, True,
                   partition // config.tile_n, partitions, stores or num_splits > 1)


def _launch_attention(out, q, k_cache, v_cache, meta, scale, seqs: _SeqRange, launch: _Launch,
                      rope: "triton_decode_preload.Rope | None" = None):
    """rope: q before RoPE, rotated and the new keys and values written in the launch (a
    preloading decode's)."""
    if launch.fused:
        _launch_fused_decode(out, q, k_cache, v_cache, meta, scale, seqs, launch)
        return
    num_heads, head_dim = q.shape[1:]
    split = launch.partials
    if split:
        held = launch.max_partitions if launch.partition_tiles else launch.num_splits
        part_m = torch.empty(seqs.num_tokens, num_heads, held,
                             dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(*part_m.shape, head_dim, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_m = part_l = out  # unused by the kernel
    query_start_loc = meta.query_start_loc[seqs.first:seqs.end + 1]
    num_seqs = seqs.end - seqs.first
    cfg = launch.config
    with_pdl = pdl.launch_options(q.device)
    if launch.preload:
        triton_decode_preload.launch(
            part_acc, part_m, part_l, q, k_cache, v_cache, meta.block_tables[seqs.first:],
            meta.seq_lens[seqs.first:], query_start_loc, num_seqs, seqs.token_offset,
            scale * math.log2(math.e), cfg, launch.group, launch.group_p, seqs.num_tokens,
            launch.num_splits, _dot_precision(q.dtype, False), rope,
            fp8_pairs(v_cache, head_dim) and seqs.num_tokens == 1)
    else:
        grid = (launch.num_q_blocks, k_cache.shape[2], launch.num_splits)
        paged_attention_kernel[grid](
            out, part_acc, part_m, part_l, q, k_cache, v_cache,
            meta.block_tables[seqs.first:], meta.seq_lens[seqs.first:], query_start_loc,
            num_seqs, seqs.token_offset, scale * math.log2(math.e),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *k_cache.stride()[:3], *v_cache.stride()[:3], meta.block_tables.stride(0),
            GROUP=launch.group, GROUP_P=launch.group_p, BLOCK_Q=launch.block_q,
            BLOCK_M=cfg.block_m, TILE_N=cfg.tile_n, BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim), SPLIT=split,
            DOT_PRECISION=_dot_precision(q.dtype, launch.invariant),
            MASK_EVERY_TILE=launch.invariant, PARTITION_TILES=launch.partition_tiles,
            max_partitions=launch.max_partitions, CONTEXT_SPLITS=launch.context_splits,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **with_pdl)
    if split and launch.partition_tiles:
        reduce_partitions_kernel[(seqs.num_tokens, num_heads)](
            out, part_acc, part_m, part_l, query_start_loc, meta.seq_lens[seqs.first:],
            num_seqs, seqs.token_offset, launch.max_partitions, out.stride(0), out.stride(1),
            TILE_N=cfg.tile_n, PARTITION_TILES=launch.partition_tiles, HEAD_DIM=head_dim,
            HEAD_DIM_P=triton.next_power_of_2(head_dim), num_warps=4, **with_pdl)
    elif split:
        reduce_splits_kernel[(seqs.num_tokens, num_heads)](
            out, part_acc, part_m, part_l, query_start_loc, meta.seq_lens[seqs.first:],
            num_seqs, seqs.token_offset, out.stride(0), out.stride(1),
            NUM_SPLITS=launch.num_splits, NUM_SPLITS_P=triton.next_power_of_2(launch.num_splits),
            HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim),
            CONTEXT_SPLITS=launch.context_splits,
            EARLY_LOADS=pdl.early_loads() and switch(REDUCE_EARLY_ENV, "1"),
            num_warps=REDUCE_WARPS, **with_pdl)


def _launch_fused_decode(out, q, k_cache, v_cache, meta, scale, seqs: _SeqRange,
                         launch: _Launch):
    num_heads, head_dim = q.shape[1:]
    rows, kv_heads, splits = launch.num_q_blocks, k_cache.shape[2], launch.num_splits
    if splits > 1:
        part_m = torch.empty(rows, num_heads, splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(*part_m.shape, head_dim, dtype=torch.float32, device=q.device)
        tickets = _tickets(q.device, rows * kv_heads)
    else:  # unused by the kernel, the tickets an int32 pointer all the same
        part_acc = part_m = part_l = out
        tickets = _tickets(q.device, 0)
        if tickets is None:
            tickets = torch.empty(1, dtype=torch.int32, device=q.device)
    cfg = launch.config
    grid = (kv_heads, rows, splits) if FUSED_HEADS_FIRST else (rows, kv_heads, splits)
    decode_attention_kernel[grid](
        out, part_acc, part_m, part_l, tickets, q, k_cache, v_cache,
        meta.block_tables[seqs.first:], meta.seq_lens[seqs.first:],
        meta.query_start_loc[seqs.first:seqs.end + 1], seqs.end - seqs.first,
        seqs.token_offset, scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], meta.block_tables.stride(0),
        GROUP=launch.group, GROUP_P=launch.group_p, BLOCK_M=cfg.block_m, TILE_N=cfg.tile_n,
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim), SPLITS_P=triton.next_power_of_2(splits),
        SPLIT_TOKENS=FUSED_SPLIT_TOKENS, DOT_PRECISION=_dot_precision(q.dtype, False),
        HEADS_FIRST=FUSED_HEADS_FIRST, FP8_PAIRS=fp8_pairs(v_cache, head_dim),
        FP8_F16=fp8_f16(q, v_cache), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl.launch_options(q.device))


def _dot_precision(dtype: torch.dtype, invariant: bool) -> str:
    """fp32 dots in tf32x3 (three tf32 products) by default, in full fp32 when invariant;
    16-bit dots take their inputs as they are either way."""
    if dtype != torch.float32:
        return "tf32"
    return "ieee" if invariant else "tf32x3"


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("KV cache head_dim must be contiguous")
