"""The batch-invariant GEMM on CUDA: no split-K, K walked tile by tile (BLOCK_K fixed) in
increasing order, so an output element's sum depends only on its row of x, its row of w and
the chunking of K, never on how many rows or columns run with it (the CUDA-graph bucket,
the batch, the TP shard's width); the output tile's size may follow the row count
(`tiles_for`).

A program owns one [BLOCK_M, BLOCK_N] tile of the output and one block (grid axis 2): a run
of consecutive K chunks, each summed into a fresh fp32 accumulator added to the block's
total in chunk order. One block holding every chunk adds the bias and stores x's dtype (the
column-parallel projections, `k_chunks.column_chunks`); several store fp32 totals for
`sum_chunks_kernel` to add: one per chunk (the partials), or one per group of a grouped sum
(a row-parallel projection's two halves, `reduction.py`), or a TP rank's own run.

Both ways do the same arithmetic (each chunk's MMA loop, then fp32 adds from zero in chunk
order, the bias, one rounding), so which one runs may depend on the shape: a product of few
output tiles and a long K (the down projection at decode batches) spreads its chunks over
programs and `sum_chunks_kernel` adds them, instead of leaving most SMs on long loops
(PARASHIFT_DETERMINISTIC_SPREAD: `auto`, the default; `1` whenever the tiles are fewer than
SMs, the rule before the twelfth session's sweep; `0` never). A product of one chunk (a
column-parallel one of K below `k_chunks.SPREAD_MIN_K`) has nothing to spread."""
import inspect
import os

import torch
import triton
import triton.language as tl

from parashift.deterministic.k_chunks import SPREAD_MIN_K
from parashift.kernels import num_sms



def tile_config(text: str) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) from "m,n,k,warps,stages"."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if (len(values) != 5 or min(values[:3]) < 16 or values[4] < 1
            or any(v & (v - 1) for v in values[:4])):
        raise ValueError(f"PARASHIFT_DETERMINISTIC_GEMM_TILES={text!r}: expected m,n,k,warps,"
                         "stages with m, n, k powers of two of at least 16 and warps a power "
                         "of two")
    return values


# The tile by row count. Every configuration shares BLOCK_K and walks K the same way, and on an
# H200 every one of those measured gave the same bits as 64x64 for the 8B shape's projections
# at 1 to 4096 rows, mma.sync (16 rows) and wgmma alike, 128x256 tiles included (2026-11-23 and
# the twenty-first session, docs/benchmark_log.md): the tile changes which program computes an
# element, not the MMA chain that sums it. 5 stages instead of 3 made the few-rows tile up to
# 1.9x faster at 32-64 rows for qkv and down (twelfth session). With the chunk and tile loops
# flattened into one pipeline (twenty-first session), the four projections per layer took,
# against cuBLAS: 0.275 against 0.185 ms at 256 rows with 128x64 tiles, 0.407 against 0.300 at
# 512 with 64x128 tiles loaded by TMA, 2.51 against 2.24 at 4096 with 128x256 tiles (8 warps)
# loaded by TMA (64x128 with TMA: 3.51).
# PARASHIFT_DETERMINISTIC_GEMM_TILES=m,n,k,warps,stages pins one configuration for every shape.
BLOCK_K = 64
FEW_ROWS_TILES = (64, 64, BLOCK_K, 4, 5)
MANY_ROWS_TILES = (128, 64, BLOCK_K, 4, 4)
FEW_ROWS = 64  # at most this many rows take FEW_ROWS_TILES
# from MID_ROWS rows on the tiles are loaded by TMA where it can (`_takes_tma`): 64x128 tiles,
# then 128x256 from LARGE_ROWS; loaded by pointers (the TP partials, or no TMA) they were
# 4-5x slower than that at 4096 rows, so those keep 128x64, then 64x128
MID_ROWS, LARGE_ROWS = 512, 1024
TMA_TILES = {MID_ROWS: (64, 128, BLOCK_K, 4, 4), LARGE_ROWS: (128, 256, BLOCK_K, 8, 3)}
POINTER_TILES = {MID_ROWS: MANY_ROWS_TILES, LARGE_ROWS: (64, 128, BLOCK_K, 4, 4)}
# decode batches of 256-511 rows: the widest and the longest products load by TMA too (the
# 8B shape's gate_up, N 28672: 128x256 tiles 0.115 ms against 128x64's 0.137; its down, K
# 14336: 64x64 tiles 0.070 against 0.081; twenty-first session)
DECODE_TMA_ROWS, WIDE_N, LONG_K = 256, 16384, 8192
# and products of 8,192 to 16,383 columns (a TP=2 rank's half of gate_up, N 14336) take
# 128x128 tiles of 8 warps, loaded by pointers: 0.054 ms against 128x64's 0.065 and 128x256
# by TMA's 0.059 at 256 rows (`det_tiles.py --column-check`, thirty-first session)
MID_N, MID_N_TILES = 8192, (128, 128, BLOCK_K, 8, 3)
# and the narrow ones (a TP=2 rank's half of qkv, N 3072) load 64x64 tiles of 5 stages by
# TMA: 0.0177 ms against 128x64's 0.0223 by pointers at 256 rows, in CUDA graphs with weights
# from HBM (`det_tiles.py --column-check`, thirty-second session)
NARROW_N = 4096
# a TP rank's run of the K chunks at 256-511 rows, of fewer output tiles than SMs and K below
# SHORT_RUN_K (TP=2's half of the 8B's o projection, K 2048), stays in program in small tiles
# instead of spreading its chunks: the pair-exchanged projection took 0.029 ms so against
# 0.037 spread (`det_tp_sum.py --rows 256` with PARASHIFT_DETERMINISTIC_GEMM_TILES and
# PARASHIFT_DETERMINISTIC_SPREAD=0, thirty-first session); the down projection's half (K 7168)
# kept its spread (0.058 against 0.059-0.067 in program)
SHORT_RUN_K, FILL_TILES = 4096, (64, 32, BLOCK_K, 4, 4)
_PINNED = os.environ.get("PARASHIFT_DETERMINISTIC_GEMM_TILES")
PINNED_TILES = tile_config(_PINNED) if _PINNED else None


def tiles_for(rows: int, tma: bool = False, n: int = 0, k: int = 0
              ) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) for a product of `rows` rows, `n` output
    columns and `k` input columns, its tiles loaded by TMA or not."""
    if PINNED_TILES is not None:
        return PINNED_TILES
    if tma and DECODE_TMA_ROWS <= rows < MID_ROWS and (n >= WIDE_N or k >= LONG_K
                                                       or n < NARROW_N):
        return TMA_TILES[LARGE_ROWS] if n >= WIDE_N else FEW_ROWS_TILES
    if DECODE_TMA_ROWS <= rows < MID_ROWS and MID_N <= n < WIDE_N:
        return MID_N_TILES
    if rows <= FEW_ROWS:
        return FEW_ROWS_TILES
    if rows < MID_ROWS:
        return MANY_ROWS_TILES
    return (TMA_TILES if tma else POINTER_TILES)[MID_ROWS if rows < LARGE_ROWS else LARGE_ROWS]


SPREAD_MODES = ("auto", "1", "0")
SPREAD_MODE = os.environ.get("PARASHIFT_DETERMINISTIC_SPREAD", "auto")
if SPREAD_MODE not in SPREAD_MODES:
    raise ValueError(f"PARASHIFT_DETERMINISTIC_SPREAD must be one of {SPREAD_MODES}, "
                     f"got {SPREAD_MODE!r}")
# auto: from SPREAD_MIN_K (`k_chunks.py`: the column-parallel products below it come in one
# chunk, so they cannot spread whatever the mode)
# a grouped sum in program holds three fp32 tiles (the chunk's, its group's, the total): at
# most this many elements of each per thread, else GROUPED_LARGE_TILES (the 128x256 tiles'
# 128 would spill)
GROUPED_TILE_ELEMENTS = 64
GROUPED_LARGE_TILES = (128, 128, BLOCK_K, 8, 3)
# from this many rows a grouped sum runs its groups in programs of their own and adds them in
# `sum_chunks_kernel` instead, keeping the 128x256 tiles: the 8B shape's prefill of 4096
# tokens on one H200 took 1.066x the plain chunk order's time so, 1.10x in program (two
# machines, each against the plain order on it; twenty-second session); decode batches of
# 256 took 1.024x in program, 1.039x so
GROUPS_OVER_PROGRAMS_ROWS = LARGE_ROWS
# the chunk sums' tile: an element's sum does not depend on it. With the GEMM's 64x64 tile at
# 64 rows the sums of the down projection's spread chunks ran on 64 programs and took 0.72 ms
# of a 7.6 ms decode step (twenty-first session); this gives 4x as many.
SUM_TILE = (16, 64)
# the in-program chunks in one K loop (`_chunk_sums_one_loop`); 0: a loop per chunk
ONE_LOOP = os.environ.get("PARASHIFT_DETERMINISTIC_ONE_LOOP", "1") != "0"
# that loop's tiles loaded by the tensor memory accelerator (`tma_matmul_kernel`; Hopper and
# later, 16-bit operands with 16-byte aligned rows), the same MMA chain: `auto` (the default)
# from MID_ROWS rows on, `1` wherever it can, `0` never (at one row, 1 made the decode step
# 1.3x slower)
TMA_MODES = ("auto", "1", "0")
TMA = os.environ.get("PARASHIFT_DETERMINISTIC_GEMM_TMA", "auto")
if TMA not in TMA_MODES:
    raise ValueError(f"PARASHIFT_DETERMINISTIC_GEMM_TMA must be one of {TMA_MODES}, got {TMA!r}")

_generic = {"do_not_specialize": ("M",)}
if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
    _generic["do_not_specialize_on_alignment"] = ("M",)


@triton.jit
def _chunk_sum(x_ptr, w_ptr, offs_m, offs_n, chunk, M, N, chunk_k, stride_xm, stride_wn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, chunk_k, BLOCK_K):
        k_ok = (k0 + offs_k) < chunk_k
        cols = (chunk * chunk_k + k0 + offs_k).to(tl.int64)
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + cols[None, :],
                    mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + cols[None, :],
                    mask=(offs_n[:, None] < N) & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _chunk_sums_one_loop(x_ptr, w_ptr, offs_m, offs_n, M, N, num_chunks, stride_xm, stride_wn,
                         TILES_PER_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    """What the chunk loop over `_chunk_sum` computes (each chunk's MMA chain from a zero
    accumulator, added to the total in chunk order), its two loops flattened into one
    pipeline, so the loads stay pipelined across chunk boundaries; chunk_k a multiple of
    BLOCK_K."""
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    for chunk in tl.range(0, num_chunks, flatten=True):
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for t in range(0, TILES_PER_CHUNK):
            cols = ((chunk * TILES_PER_CHUNK + t) * BLOCK_K + offs_k).to(tl.int64)
            a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + cols[None, :],
                        mask=offs_m[:, None] < M, other=0.0)
            b = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + cols[None, :],
                        mask=offs_n[:, None] < N, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        total += acc
    return total


@triton.jit
def _run_sum(x_ptr, w_ptr, offs_m, offs_n, M, N, chunk_k, num_chunks, stride_xm, stride_wn,
             WHOLE_TILES: tl.constexpr, TILES_PER_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The first `num_chunks` chunks from x_ptr and w_ptr summed in chunk order from zero."""
    if WHOLE_TILES:
        total = _chunk_sums_one_loop(x_ptr, w_ptr, offs_m, offs_n, M, N, num_chunks,
                                     stride_xm, stride_wn, TILES_PER_CHUNK, BLOCK_M, BLOCK_N,
                                     BLOCK_K, DOT_PRECISION)
    else:
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for chunk in range(0, num_chunks):
            total += _chunk_sum(x_ptr, w_ptr, offs_m, offs_n, chunk, M, N, chunk_k, stride_xm,
                                stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
    return total


@triton.jit
def _store(out_ptr, mirror_ptr, total, offs_m, offs_n, M, N, stride_om, MIRROR: tl.constexpr):
    offs = offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
    if MIRROR:
        tl.store(mirror_ptr + offs, total.to(mirror_ptr.dtype.element_ty), mask=mask)


@triton.jit(**_generic)
def invariant_matmul_kernel(out_ptr, mirror_ptr, x_ptr, w_ptr, bias_ptr, M, N, chunk_k,
                            num_chunks, stride_xm, stride_wn, stride_ob, stride_om,
                            WHOLE_TILES: tl.constexpr, TILES_PER_CHUNK: tl.constexpr,
                            GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, MIRROR: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid axis 2 is the block: a run of `num_chunks` chunks, summed in the program (in
    GROUPS equal runs, each from zero, then the runs' sums) and stored at out[block]; with
    MIRROR at mirror[block] too (another tensor of out's strides: a peer's, pair_exchange.py)."""
    block = tl.program_id(2).to(tl.int64)
    k_start = block * num_chunks * chunk_k
    x_ptr += k_start
    w_ptr += k_start
    out_ptr += block * stride_ob
    mirror_ptr += block * stride_ob
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if GROUPS == 1:
        total = _run_sum(x_ptr, w_ptr, offs_m, offs_n, M, N, chunk_k, num_chunks, stride_xm,
                         stride_wn, WHOLE_TILES, TILES_PER_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K,
                         DOT_PRECISION)
    else:
        per_group = num_chunks // GROUPS
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for group in tl.static_range(GROUPS):
            shift = group * per_group * chunk_k
            total += _run_sum(x_ptr + shift, w_ptr + shift, offs_m, offs_n, M, N, chunk_k,
                              per_group, stride_xm, stride_wn, WHOLE_TILES, TILES_PER_CHUNK,
                              BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    _store(out_ptr, mirror_ptr, total, offs_m, offs_n, M, N, stride_om, MIRROR)


@triton.jit(**_generic)
def tma_matmul_kernel(out_ptr, mirror_ptr, x_desc, w_desc, bias_ptr, M, N, num_chunks,
                      stride_ob, stride_om, TILES_PER_CHUNK: tl.constexpr, GROUPS: tl.constexpr,
                      HAS_BIAS: tl.constexpr, MIRROR: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """`invariant_matmul_kernel` with its chunks in one (flattened) K loop per group, the
    tiles loaded through tensor descriptors (rows past M or N read as zeros)."""
    m0, n0 = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    block = tl.program_id(2)
    out_ptr += block.to(tl.int64) * stride_ob
    mirror_ptr += block.to(tl.int64) * stride_ob
    per_group = num_chunks // GROUPS
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for group in tl.static_range(GROUPS):
        first_tile = (block * num_chunks + group * per_group) * TILES_PER_CHUNK
        run = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for chunk in tl.range(0, per_group, flatten=True):
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for t in range(0, TILES_PER_CHUNK):
                k = (first_tile + chunk * TILES_PER_CHUNK + t) * BLOCK_K
                acc = tl.dot(x_desc.load([m0, k]), tl.trans(w_desc.load([n0, k])), acc,
                             input_precision=DOT_PRECISION)
            run += acc
        if GROUPS == 1:
            total = run
        else:
            total += run
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    _store(out_ptr, mirror_ptr, total, offs_m, offs_n, M, N, stride_om, MIRROR)


@triton.jit(**_generic)
def sum_chunks_kernel(out_ptr, mirror_ptr, part_ptr, bias_ptr, init_ptr, M, N, num_chunks,
                      groups, stride_pc, stride_pm, stride_om, stride_im, HAS_BIAS: tl.constexpr,
                      HAS_INIT: tl.constexpr, GROUPED: tl.constexpr, MIRROR: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out = (0 + partial 0 + partial 1 + ... + bias) in fp32, rounded once to out's dtype:
    what the chunk loop of `invariant_matmul_kernel` computes; with HAS_INIT the sum starts
    from the fp32 running sum of the chunks before these (another rank's); GROUPED: the
    partials in `groups` equal runs, each summed from zero, then the runs' sums."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    parts = part_ptr + offs_m[:, None].to(tl.int64) * stride_pm + offs_n[None, :]
    if HAS_INIT:
        total = tl.load(init_ptr + offs_m[:, None].to(tl.int64) * stride_im + offs_n[None, :],
                        mask=mask, other=0.0)
    else:
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GROUPED:
        for _ in range(0, groups):
            run = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for _ in range(0, num_chunks // groups):
                run += tl.load(parts, mask=mask, other=0.0)
                parts += stride_pc
            total += run
    else:
        for _ in range(0, num_chunks):
            total += tl.load(parts, mask=mask, other=0.0)
            parts += stride_pc
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    _store(out_ptr, mirror_ptr, total, offs_m, offs_n, M, N, stride_om, MIRROR)


def _operands(x: torch.Tensor, weight: torch.Tensor, chunks: int):
    if x.shape[1] != weight.shape[1] or x.shape[1] % chunks:
        raise ValueError(f"cannot multiply [{x.shape[0]}, {x.shape[1]}] by the transpose of "
                         f"{list(weight.shape)} in {chunks} K chunks")
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    return x, weight, x.shape[1] // chunks


def _flattens(chunk_k: int, block_k: int) -> bool:
    """The chunk and tile loops may be flattened into one: whole tiles, two or more per chunk
    (with one tile per chunk the flattened loop gave other bits than the loop per chunk on an
    H200; the cause was not looked into)."""
    return chunk_k % block_k == 0 and chunk_k >= 2 * block_k


def _takes_tma(x: torch.Tensor, weight: torch.Tensor, chunk_k: int, block_k: int) -> bool:
    rows, n, k = x.shape[0], weight.shape[0], x.shape[1]
    wanted = TMA == "1" or (TMA == "auto" and (rows >= MID_ROWS or (
        rows >= DECODE_TMA_ROWS and (n >= WIDE_N or k >= LONG_K or n < NARROW_N))))
    return (wanted and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and torch.cuda.get_device_capability(x.device)[0] >= 9 and _flattens(chunk_k, block_k)
            and all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
                    for t in (x, weight)))


def _launch(out, x, weight, bias, chunks: int, blocks: int, chunk_k: int, groups: int = 1,
            mirror: torch.Tensor | None = None, tiles: tuple | None = None):
    """out [blocks, M, N] (or [M, N] for one block): each block's run of chunks / blocks
    chunks summed in program (in `groups` runs, then their sums); stored in `mirror` (out's
    shape and strides) too, where given. tiles: loaded by pointers in these (else
    `tiles_for`)."""
    m, n = x.shape[0], weight.shape[0]
    per_block = chunks // blocks
    tma = tiles is None and _takes_tma(x, weight, chunk_k, tiles_for(m)[2])
    block_m, block_n, block_k, warps, stages = tiles or tiles_for(m, tma, n, x.shape[1])
    if groups > 1 and block_m * block_n > GROUPED_TILE_ELEMENTS * 32 * warps:
        block_m, block_n, block_k, warps, stages = GROUPED_LARGE_TILES
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), blocks)
    stride_ob = out.stride(0) if blocks > 1 else 0
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        tma_matmul_kernel[grid](
            out, out if mirror is None else mirror,
            TensorDescriptor.from_tensor(x, [block_m, block_k]),
            TensorDescriptor.from_tensor(weight, [block_n, block_k]),
            bias if bias is not None else out, m, n, per_block, stride_ob, out.stride(-2),
            TILES_PER_CHUNK=chunk_k // block_k, GROUPS=groups, HAS_BIAS=bias is not None,
            MIRROR=mirror is not None, BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_K=block_k,
            DOT_PRECISION="tf32", num_warps=warps, num_stages=stages, enable_fp_fusion=False)
        return out
    whole_tiles = ONE_LOOP and _flattens(chunk_k, block_k)
    invariant_matmul_kernel[grid](
        out, out if mirror is None else mirror, x, weight, bias if bias is not None else out,
        m, n, chunk_k, per_block,
        x.stride(0), weight.stride(0), stride_ob, out.stride(-2),
        WHOLE_TILES=whole_tiles, TILES_PER_CHUNK=chunk_k // block_k if whole_tiles else 0,
        GROUPS=groups, HAS_BIAS=bias is not None, MIRROR=mirror is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages, enable_fp_fusion=False)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           chunks: int, spread: bool | None = None, groups: int = 1) -> torch.Tensor:
    """[M, K] @ [N, K].T + bias, K in `chunks` chunks summed in order (in `groups` runs,
    each from zero, then the runs' sums: `matmul.ordered_sum`), in x's dtype.
    spread: the chunks over programs (None: by PARASHIFT_DETERMINISTIC_SPREAD)."""
    if spread is None:
        spread = chunks > 1 and _spreads(x.shape[0], weight.shape[0], x.shape[1], x.device)
    if spread:
        return sum_chunks(chunk_partials(x, weight, chunks), bias, x.dtype, groups=groups)
    if groups > 1 and x.shape[0] >= GROUPS_OVER_PROGRAMS_ROWS:
        return sum_chunks(fold_chunks(x, weight, chunks, groups), bias, x.dtype)
    x, weight, chunk_k = _operands(x, weight, chunks)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _launch(out, x, weight, bias, chunks, 1, chunk_k, groups)


def sum_chunks(partials: torch.Tensor, bias: torch.Tensor | None,
               dtype: torch.dtype, init: torch.Tensor | None = None,
               groups: int = 1, out: torch.Tensor | None = None,
               mirror: torch.Tensor | None = None) -> torch.Tensor:
    """[chunks, M, N] fp32 partials added in chunk order (after `init` [M, N] fp32, if
    given; in `groups` runs, as `matmul.ordered_sum`), plus bias, in `dtype`; into `out`
    (and `mirror`, of out's strides) where given."""
    if groups > 1 and init is not None:
        raise ValueError("a grouped sum starts from zero")
    partials = partials if partials.stride(-1) == 1 else partials.contiguous()
    chunks, m, n = partials.shape
    if init is not None and init.stride(-1) != 1:
        init = init.contiguous()
    out = torch.empty(m, n, dtype=dtype, device=partials.device) if out is None else out
    block_m, block_n = SUM_TILE
    sum_chunks_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        out, out if mirror is None else mirror, partials, bias if bias is not None else out,
        init if init is not None else out,
        m, n, chunks, groups, partials.stride(0), partials.stride(1), out.stride(0),
        init.stride(0) if init is not None else 0, HAS_BIAS=bias is not None,
        HAS_INIT=init is not None, GROUPED=groups > 1, MIRROR=mirror is not None,
        BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=4, enable_fp_fusion=False)
    return out


def _spreads(m: int, n: int, k: int, device: torch.device) -> bool:
    if SPREAD_MODE == "0":
        return False
    if SPREAD_MODE == "1":
        return _tiles(m, n) < num_sms(device)
    return k >= SPREAD_MIN_K and 2 * _tiles(m, n) <= num_sms(device)


def _tiles(m: int, n: int) -> int:
    block_m, block_n = tiles_for(m)[:2]
    return triton.cdiv(m, block_m) * triton.cdiv(n, block_n)


def chunk_partials(x: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """[chunks, M, N] fp32 partial products, one per K chunk."""
    return fold_chunks(x, weight, chunks, chunks)


def fold_chunks(x: torch.Tensor, weight: torch.Tensor, chunks: int, blocks: int,
                out: torch.Tensor | None = None, mirror: torch.Tensor | None = None
                ) -> torch.Tensor:
    """[blocks, M, N] fp32: each of `blocks` equal runs of the K chunks summed in chunk
    order from zero (`matmul.fold_chunks`). One block of fewer output tiles than SMs (a TP
    rank's run at decode batches) spreads its chunks over programs whatever its K: on two
    H200s, 8B shape, TP=2 (twenty-second session) that took its decode step at 1 row from
    4.98 to 4.43 ms and at 64 from 6.48 to 6.03 (PARASHIFT_DETERMINISTIC_SPREAD=0: never).
    Into `out` [blocks, M, N] fp32 (and `mirror`, of out's strides) where given.
    A short run (K below SHORT_RUN_K) of DECODE_TMA_ROWS to MID_ROWS rows stays in program,
    in FILL_TILES (with the spread mode `auto` and no pinned tiles)."""
    tiles = None
    if (blocks == 1 < chunks and SPREAD_MODE != "0"
            and _tiles(x.shape[0], weight.shape[0]) < num_sms(x.device)):
        if (SPREAD_MODE == "auto" and PINNED_TILES is None
                and DECODE_TMA_ROWS <= x.shape[0] < MID_ROWS and x.shape[1] < SHORT_RUN_K):
            tiles = FILL_TILES
        else:
            return sum_chunks(chunk_partials(x, weight, chunks), None, torch.float32,
                              out=None if out is None else out[0],
                              mirror=None if mirror is None else mirror[0]).unsqueeze(0)
    x, weight, chunk_k = _operands(x, weight, chunks)
    if out is None:
        out = torch.empty(blocks, x.shape[0], weight.shape[0], dtype=torch.float32,
                          device=x.device)
    return _launch(out, x, weight, None, chunks, blocks, chunk_k, mirror=mirror, tiles=tiles)
