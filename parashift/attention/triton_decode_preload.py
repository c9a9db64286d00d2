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
context with few splits; rows of no sequence exit at once (the reduction writes their zeros).

Not batch-invariant: deterministic mode keeps `triton_kernels`' fixed partitions."""
import triton
import triton.language as tl

from parashift.attention.triton_kernels import (NEG_BIG, _attend_tiles, _jit_generic_in,
                                                _store_partial)
from parashift.kernels import pdl

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
    """Online softmax over one key and value ([HEAD_DIM_P] each, in fp32): a score a row."""
    s = tl.sum(q.to(tl.float32) * k_row[None, :], 1) * qk_scale
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * v_row[None, :]
    return acc, m_new, l_i


@_jit_generic_in("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_seqs",
                 "token_offset", "stride_bt")
def preloaded_decode_kernel(
        part_acc_ptr, part_m_ptr, part_l_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, token_offset, qk_scale,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt,
        GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_M: tl.constexpr,
        TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
        HEAD_DIM_P: tl.constexpr, SPLIT_TOKENS: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PREFETCH_TILES: tl.constexpr, ROW_LINES: tl.constexpr, LINE_ELEMS: tl.constexpr,
        USE_PDL: tl.constexpr = False):
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
    if (q_end == q_start) | (split >= num_splits):
        return
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
    v_first = tl.load((v_base + block * stride_vb + in_block * stride_vs)[:, None]
                      + offs_d[None, :], mask=kv_mask, other=0.0)
    holds_new = split == num_splits - 1
    new_block = tl.load(block_table + old // BLOCK_SIZE).to(tl.int64)
    if USE_PDL and PREFETCH_TILES > 0:
        _prefetch_tiles(k_base, v_base, block_table, lo + 1, hi, old, stride_kb, stride_ks,
                        stride_vb, stride_vs, TILE_N, BLOCK_SIZE, PREFETCH_TILES, ROW_LINES,
                        LINE_ELEMS)
    pdl.start(USE_PDL)

    rows = tl.arange(0, BLOCK_M)
    row_head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    io_mask = row_ok[:, None] & d_ok[None, :]
    token = (token_offset + i).to(tl.int64)
    q = tl.load((q_ptr + token * stride_qt + row_head * stride_qh)[:, None] + offs_d[None, :],
                mask=io_mask, other=0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_loaded(acc, m_i, l_i, q, k_first.to(q.dtype), v_first.to(q.dtype),
                                   n_ok, qk_scale, DOT_PRECISION)
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + old
    acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo + 1, hi,
                                  old, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                  stride_vs, True, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
                                  DOT_PRECISION)
    if holds_new:  # the new token, written by the kernel before
        new_in_block = old % BLOCK_SIZE
        k_new = tl.load(k_base + new_block * stride_kb + new_in_block * stride_ks + offs_d,
                        mask=d_ok, other=0.0)
        v_new = tl.load(v_base + new_block * stride_vb + new_in_block * stride_vs + offs_d,
                        mask=d_ok, other=0.0)
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
           group: int, group_p: int, num_rows: int, num_splits: int, dot_precision: str) -> None:
    """Partial states of `num_rows` one-row decodes (sequences from the metadata slices
    given) into part_* ([rows, heads, num_splits(, head_dim)]), SPLIT_TOKENS = config's KV
    tile."""
    head_dim = q.shape[2]
    row_lines, line_elems = prefetch_shape(head_dim, k_cache.element_size())
    preloaded_decode_kernel[(num_rows, k_cache.shape[2], num_splits)](
        part_acc, part_m, part_l, q, k_cache, v_cache, block_tables, seq_lens,
        query_start_loc, num_seqs, token_offset, qk_scale,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0),
        GROUP=group, GROUP_P=group_p, BLOCK_M=config.block_m, TILE_N=config.tile_n,
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim), SPLIT_TOKENS=config.tile_n,
        DOT_PRECISION=dot_precision, PREFETCH_TILES=PREFETCH_TILES, ROW_LINES=row_lines,
        LINE_ELEMS=line_elems, num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl.launch_options(q.device))
