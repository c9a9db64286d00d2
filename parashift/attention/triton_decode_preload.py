"""Split-KV decode attention whose KV loads start before the kernel before it has finished.

Under PDL (kernels/pdl.py) a kernel starts while the one before it runs; everything older is
complete by then. Before a decode attention launch the kernel before writes only the rotated
queries and each sequence's new key and value (the last position of its context): the
metadata, the block tables and every older position of the pool are final. So each program
here, before its grid wait, reads its sequence's length and block table entries, loads its
split's first KV tile into registers (the context before the new token only) and prefetches
the next PREFETCH_TILES tiles into L2; after the wait it loads q, attends to the preloaded
tile and the rest of its tiles, and the split holding the new token reads that one key and
value from the pool and merges it as one more score. At one row (8B heads, context 1,024,
16 splits of one 64-token tile each) the chain of dependent loads (metadata, block table,
K, V) then runs during the previous kernel rather than after it.

Programs store their partial states as the split kernel's do ([row, head, split] of
[rows, heads, grid splits]); `reduce_splits_kernel` with CONTEXT_SPLITS = SPLIT_TOKENS
merges them. A sequence takes min(grid splits, ceil(context / SPLIT_TOKENS)) splits (the
others exit before their wait), so a graph captured for a long max_model_len runs a short
context with few splits; rows of no sequence exit at once (the reduction writes their
zeros).

ROPE: the kernel before is the QKV projection and this one does what kernels/rotary.py's
rotate_and_write_kv did between them: each program rotates its q heads (their q/k norms
first, QK_NORM), the split holding the new token rotates its key, attends to it from
registers and writes it and its value to their slot (`TritonAttentionBackend.
rotate_and_attend`, for steps that are such decodes only).

Not batch-invariant: deterministic mode keeps `triton_kernels`' fixed partitions."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from parashift.attention.triton_fp8_values import (attend_pairs, attend_tiles_fp8, joined,
                                                   pair_rows, zero_halves)
from parashift.attention.triton_kernels import (NEG_BIG, _attend_tiles, _jit_generic_in,
                                                _store_partial)
from parashift.engine_switches import switch
from parashift.kernels import pdl



@dataclass(frozen=True)
class Rope:
    """What a launch with RoPE takes beside q (before RoPE): this step's keys and values
    before RoPE ([tokens, KV heads, head_dim], last dimension contiguous), positions [tokens],
    cos_sin [positions, head_dim] = cat(cos, sin) (contiguous), the slots, and (q norm
    weight, k norm weight, eps) or None."""
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    slot_mapping: torch.Tensor
    norms: tuple | None = None


def rope_args(q: torch.Tensor, rope: Rope | None) -> tuple:
    """A decode kernel's RoPE arguments (this one's, triton_decode.py's): k, v, their
    strides, positions, cos_sin, its stride, the slots, the q and k norm weights and eps
    (without `rope`: q for every pointer, zeros)."""
    if rope is None:
        return (q, q, 0, 0, 0, 0, q, q, 0, q, q, q, 0.0)
    q_norm, k_norm, eps = rope.norms if rope.norms is not None else (q, q, 0.0)
    return (rope.k, rope.v, *rope.k.stride()[:2], *rope.v.stride()[:2], rope.positions,
            rope.cos_sin, rope.cos_sin.stride(0), rope.slot_mapping, q_norm, k_norm, eps)


NEW_FIRST_ENV = "PARASHIFT_ATTN_NEW_FIRST"
LINE_BYTES = 128  # an L2 cache line: one prefetch each
# tiles after a split's first that its programs prefetch into L2 before their wait
PREFETCH_TILES = 2


@triton.jit
def _prefetch_tiles(k_base, v_base, block_table, first_tile, end_tile, old,
                    stride_kb, stride_ks, stride_vb, stride_vs, TILE_N: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILES: tl.constexpr, ROW_LINES: tl.constexpr,
                    LINE_ELEMS: tl.constexpr):
    """Pulls the K and V rows of tiles [first_tile, min(first_tile + TILES, end_tile)) into
    L2 (positions before `old` only; the others prefetch block 0's rows, which exist)."""
    offs_n = tl.arange(0, TILE_N)[:, None]
    lines = tl.arange(0, ROW_LINES)[None, :] * LINE_ELEMS
    for t in tl.static_range(TILES):
        pos = (first_tile + t) * TILE_N + offs_n
        ok = (pos < old) & (pos < end_tile * TILE_N)
        block = tl.load(block_table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        in_block = tl.where(ok, pos % BLOCK_SIZE, 0)
        k_rows = k_base + block * stride_kb + in_block * stride_ks + lines
        v_rows = v_base + block * stride_vb + in_block * stride_vs + lines
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [k_rows],
                                  dtype=tl.int32, is_pure=False, pack=1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [v_rows],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _attend_loaded(acc, m_i, l_i, q, k, v, n_ok, qk_scale, DOT_PRECISION: tl.constexpr):
    """Online softmax over one tile already in registers (k, v [TILE_N, HEAD_DIM_P]; the
    positions where n_ok is false are not attended)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(n_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_one(acc, m_i, l_i, q, k_row, v_row, qk_scale):
    """Online softmax over one key and value ([1, HEAD_DIM_P] each, in fp32): a score a
    row."""
    s = tl.sum(q.to(tl.float32) * k_row, 1) * qk_scale
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * v_row
    return acc, m_new, l_i


@triton.jit
def _new_token(k_base, v_base, new_block, new_in_block, holds_new, k_ptr, v_ptr, token, kv_head,
               stride_kb, stride_ks, stride_vb, stride_vs, stride_kt, stride_knh, stride_vt,
               stride_vnh, offs_d, d_ok, cos_full, sin_signed, k_norm_ptr, eps, slot,
               k_cache_ptr, v_cache_ptr, ROPE: tl.constexpr, QK_NORM: tl.constexpr,
               HEAD_DIM: tl.constexpr):
    """The new token's key and value ([1, HEAD_DIM_P], in the pool's dtype) where the split
    holds it (else zeros): read from its slot (written by the kernel before), or (ROPE) from
    the projection's rows, the key rotated, both written to the slot."""
    one = tl.arange(0, 1)
    new_mask = (one < tl.where(holds_new, 1, 0))[:, None] & d_ok[None, :]
    k_slot = (k_base + new_block * stride_kb + new_in_block * stride_ks + one)[:, None]
    v_slot = (v_base + new_block * stride_vb + new_in_block * stride_vs + one)[:, None]
    if ROPE:
        k_new = _rotated(k_ptr + token * stride_kt + kv_head * stride_knh + one, offs_d,
                         new_mask, cos_full, sin_signed, k_norm_ptr, eps, QK_NORM,
                         HEAD_DIM).to(k_cache_ptr.dtype.element_ty)
        v_new = tl.load((v_ptr + token * stride_vt + kv_head * stride_vnh + one)[:, None]
                        + offs_d[None, :], mask=new_mask, other=0.0
                        ).to(v_cache_ptr.dtype.element_ty)
        written = new_mask & (one + slot >= 0)[:, None]
        tl.store(k_slot + offs_d[None, :], k_new, mask=written)
        tl.store(v_slot + offs_d[None, :], v_new, mask=written)
    else:
        k_new = tl.load(k_slot + offs_d[None, :], mask=new_mask, other=0.0)
        v_new = tl.load(v_slot + offs_d[None, :], mask=new_mask, other=0.0)
    return k_new, v_new


@triton.jit
def _rotated(rows, offs_d, mask, cos_full, sin_signed, norm_w_ptr, eps, QK_NORM: tl.constexpr,
             HEAD_DIM: tl.constexpr):
    """Heads at `rows` (pointers [R]) RMS-normed (QK_NORM) and rotated, in fp32: x * [cos |
    cos] + swap(x) * [-sin | sin], swap(x) its halves exchanged; rounded as
    kernels/rotary.py rounds the norm."""
    half: tl.constexpr = HEAD_DIM // 2
    swapped = (offs_d + half) % HEAD_DIM
    x = tl.load(rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    xs = tl.load(rows[:, None] + swapped[None, :], mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        rstd = tl.math.rsqrt(tl.sum(x * x, 1) * (1.0 / HEAD_DIM) + eps)[:, None]
        d_ok = offs_d < HEAD_DIM
        w = tl.load(norm_w_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        ws = tl.load(norm_w_ptr + swapped, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        x = (w * (x * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        xs = (ws * (xs * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    return x * cos_full + xs * sin_signed


@_jit_generic_in("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_seqs",
                 "token_offset", "stride_bt")
def preloaded_decode_kernel(
        part_acc_ptr, part_m_ptr, part_l_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, token_offset, qk_scale,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt,
        k_ptr, v_ptr, stride_kt, stride_knh, stride_vt, stride_vnh, positions_ptr, cos_sin_ptr,
        stride_cs, slot_mapping_ptr, q_norm_ptr, k_norm_ptr, eps,
        GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_M: tl.constexpr,
        TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
        HEAD_DIM_P: tl.constexpr, SPLIT_TOKENS: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PREFETCH_TILES: tl.constexpr, ROW_LINES: tl.constexpr, LINE_ELEMS: tl.constexpr,
        ROPE: tl.constexpr = False, QK_NORM: tl.constexpr = False,
        NEW_FIRST: tl.constexpr = False, USE_PDL: tl.constexpr = False,
        FP8_PAIRS: tl.constexpr = False):
    """ROPE: q_ptr, k_ptr and v_ptr are the projection's rows before RoPE (k_ptr, v_ptr:
    [tokens, KV heads, head_dim] with strides stride_kt, stride_knh / stride_vt, stride_vnh):
    each program rotates its q heads (after their RMS norms, QK_NORM), and the split holding
    the new token rotates its key, attends to it from registers and writes it and its value
    to the slot `slot_mapping` gives (slot -1: none), as kernels/rotary.py's
    rotate_and_write_kv would have before the launch. FP8_PAIRS: an FP8 pool's values read
    as 16-bit pairs (triton_fp8_values.py)."""
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    grid_splits = tl.num_programs(2)
    # before the wait: what no kernel of this step writes
    is_seq = i < num_seqs
    q_start = tl.load(query_start_loc_ptr + i, mask=is_seq, other=0)
    q_end = tl.load(query_start_loc_ptr + i + 1, mask=is_seq, other=0)
    seq_len = tl.load(seq_lens_ptr + i, mask=is_seq, other=0)
    num_splits = tl.minimum(grid_splits, tl.maximum(tl.cdiv(seq_len, SPLIT_TOKENS), 1))
    if (q_end == q_start) | (split >= num_splits):  # a row of no sequence: zeros by the
        return  # reduction
    old = seq_len - 1  # the positions cached before this step
    num_tiles = tl.cdiv(old, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    lo = split * tiles_per_split
    hi = tl.minimum(lo + tiles_per_split, num_tiles)
    block_table = block_tables_ptr + i.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    pos = lo * TILE_N + offs_n
    n_ok = (pos < old) & (pos < hi * TILE_N)  # none when the split has no tile
    block = tl.load(block_table + pos // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    in_block = pos % BLOCK_SIZE
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k_first = tl.load((k_base + block * stride_kb + in_block * stride_ks)[:, None]
                      + offs_d[None, :], mask=kv_mask, other=0.0)
    v_first_rows = v_base + block * stride_vb + in_block * stride_vs
    if FP8_PAIRS:
        v_first = tl.load(pair_rows(v_first_rows)[:, None]
                          + tl.arange(0, HEAD_DIM // 2)[None, :], mask=n_ok[:, None], other=0)
    else:
        v_first = tl.load(v_first_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    holds_new = split == num_splits - 1
    token = (token_offset + i).to(tl.int64)
    if ROPE:  # the new token's slot, and its position's [cos | cos], [-sin | sin]
        slot = tl.load(slot_mapping_ptr + token)
        cs_row = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cs
        half: tl.constexpr = HEAD_DIM // 2
        cos_full = tl.load(cs_row + offs_d % half, mask=d_ok, other=0.0).to(tl.float32)
        sin_signed = tl.load(cs_row + half + offs_d % half, mask=d_ok, other=0.0).to(tl.float32)
        sin_signed = tl.where(offs_d < half, -sin_signed, sin_signed)[None, :]
        cos_full = cos_full[None, :]
        new_block = tl.maximum(slot, 0) // BLOCK_SIZE
        new_in_block = tl.maximum(slot, 0) % BLOCK_SIZE
    else:
        # (old is -1 in no row that gets here; clamped all the same)
        new_block = tl.load(block_table + tl.maximum(old, 0) // BLOCK_SIZE, mask=is_seq,
                            other=0).to(tl.int64)
        new_in_block = tl.maximum(old, 0) % BLOCK_SIZE
        slot, cos_full, sin_signed = 0, 0.0, 0.0  # unused without ROPE
    if USE_PDL and PREFETCH_TILES > 0:
        _prefetch_tiles(k_base, v_base, block_table, lo + 1, hi, old, stride_kb, stride_ks,
                        stride_vb, stride_vs, TILE_N, BLOCK_SIZE, PREFETCH_TILES, ROW_LINES,
                        LINE_ELEMS)
    pdl.start(USE_PDL)

    rows = tl.arange(0, BLOCK_M)
    row_head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    io_mask = row_ok[:, None] & d_ok[None, :]
    q_rows = q_ptr + token * stride_qt + row_head * stride_qh
    if NEW_FIRST:  # the new token's key and value read as q is (one round trip), not after
        # the tiles: the split holding it is the launch's last to finish
        k_new, v_new = _new_token(k_base, v_base, new_block, new_in_block, holds_new, k_ptr,
                                  v_ptr, token, kv_head, stride_kb, stride_ks, stride_vb,
                                  stride_vs, stride_kt, stride_knh, stride_vt, stride_vnh,
                                  offs_d, d_ok, cos_full, sin_signed, k_norm_ptr, eps, slot,
                                  k_cache_ptr, v_cache_ptr, ROPE, QK_NORM, HEAD_DIM)
    if ROPE:
        q = _rotated(q_rows, offs_d, io_mask, cos_full, sin_signed, q_norm_ptr, eps, QK_NORM,
                     HEAD_DIM).to(q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + old
    if FP8_PAIRS:
        acc_even, acc_odd = zero_halves(BLOCK_M, HEAD_DIM)
        acc_even, acc_odd, m_i, l_i = attend_pairs(acc_even, acc_odd, m_i, l_i, q, k_first,
                                                   v_first, n_ok, pos, q_pos, qk_scale,
                                                   v_cache_ptr.dtype.element_ty, True,
                                                   DOT_PRECISION)
        acc_even, acc_odd, m_i, l_i = attend_tiles_fp8(
            acc_even, acc_odd, m_i, l_i, q, k_base, v_base, block_table, lo + 1, hi, old,
            q_pos, qk_scale, stride_kb, stride_ks, stride_vb, stride_vs, True, TILE_N,
            BLOCK_SIZE, HEAD_DIM, DOT_PRECISION)
        acc = joined(acc_even, acc_odd, BLOCK_M, HEAD_DIM)
    else:
        acc, m_i, l_i = _attend_loaded(acc, m_i, l_i, q, k_first.to(q.dtype),
                                       v_first.to(q.dtype), n_ok, qk_scale, DOT_PRECISION)
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo + 1,
                                      hi, old, q_pos, qk_scale, stride_kb, stride_ks,
                                      stride_vb, stride_vs, True, TILE_N, BLOCK_SIZE,
                                      HEAD_DIM, HEAD_DIM_P, DOT_PRECISION)
    if holds_new:  # the new token: written by the kernel before, or here (ROPE)
        if not NEW_FIRST:
            k_new, v_new = _new_token(k_base, v_base, new_block, new_in_block, holds_new,
                                      k_ptr, v_ptr, token, kv_head, stride_kb, stride_ks,
                                      stride_vb, stride_vs, stride_kt, stride_knh, stride_vt,
                                      stride_vnh, offs_d, d_ok, cos_full, sin_signed,
                                      k_norm_ptr, eps, slot, k_cache_ptr, v_cache_ptr, ROPE,
                                      QK_NORM, HEAD_DIM)
        acc, m_i, l_i = _attend_one(acc, m_i, l_i, q, k_new.to(q.dtype).to(tl.float32),
                                    v_new.to(q.dtype).to(tl.float32), qk_scale)
    pdl.inputs_read(USE_PDL)
    _store_partial(part_acc_ptr, part_m_ptr, part_l_ptr, acc, m_i, l_i, i, row_head, split,
                   grid_splits, row_ok, io_mask, offs_d, GROUP, HEAD_DIM)


def prefetch_shape(head_dim: int, elem_size: int) -> tuple[int, int]:
    """(cache lines a KV row spans, elements a line holds)."""
    line_elems = LINE_BYTES // elem_size
    return triton.next_power_of_2(triton.cdiv(head_dim, line_elems)), line_elems


def launch(part_acc, part_m, part_l, q, k_cache, v_cache, block_tables, seq_lens,
           query_start_loc, num_seqs: int, token_offset: int, qk_scale: float, config,
           group: int, group_p: int, num_rows: int, num_splits: int, dot_precision: str,
           rope: "Rope | None" = None, fp8_pairs: bool = False) -> None:
    """Partial states of `num_rows` one-row decodes (sequences from the metadata slices
    given) into part_* ([rows, heads, num_splits(, head_dim)]), SPLIT_TOKENS = config's KV
    tile; with `rope`, q is before RoPE and the new keys and values are written here;
    fp8_pairs: an FP8 pool's values read as 16-bit pairs."""
    head_dim = q.shape[2]
    row_lines, line_elems = prefetch_shape(head_dim, k_cache.element_size())
    preloaded_decode_kernel[(num_rows, k_cache.shape[2], num_splits)](
        part_acc, part_m, part_l, q, k_cache, v_cache, block_tables, seq_lens,
        query_start_loc, num_seqs, token_offset, qk_scale,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), *rope_args(q, rope),
        GROUP=group, GROUP_P=group_p, BLOCK_M=config.block_m, TILE_N=config.tile_n,
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim), SPLIT_TOKENS=config.tile_n,
        DOT_PRECISION=dot_precision, PREFETCH_TILES=PREFETCH_TILES, ROW_LINES=row_lines,
        LINE_ELEMS=line_elems, ROPE=rope is not None,
        QK_NORM=rope is not None and rope.norms is not None, NEW_FIRST=new_token_first(),
        FP8_PAIRS=fp8_pairs,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl.launch_options(q.device))


def new_token_first() -> bool:
    """PARASHIFT_ATTN_NEW_FIRST (on by default): the split holding the new token reads its key
    and value right after the wait, beside q (0: after its tiles, as before; read at each
    launch: a graph keeps its capture's)."""
    return switch(NEW_FIRST_ENV, "1")
