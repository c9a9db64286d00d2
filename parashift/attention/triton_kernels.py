"""Triton kernels for attention over the paged KV pool.

One attention kernel serves decode, prefill and mixed batches. A program
owns one query block (up to BLOCK_Q consecutive query tokens of one
sequence) for one KV head; its BLOCK_M rows are those tokens times the
GROUP query heads that share the KV head, so each KV tile is loaded once for
all of them. The grid's third axis splits the context into partitions
(flash-decoding); with more than one split the programs write partial
results that `reduce_splits_kernel` merges.

A launch covers a range of sequences whose query rows start at token_offset.
Query blocks are numbered so that sequence i's blocks start at
(query_start_loc[i] - token_offset) // BLOCK_Q + i. That bound only depends on
the token and sequence counts, so the grid never depends on data values;
programs past a sequence's last query token exit at once.

A program walks its KV tiles in two loops: the tiles every row of its query block sees
whole, without the causal mask, then the rest with it. Which loop a tile falls in depends
on where the query block starts, and the two loops compile to different instructions (the
mask stops the compiler from fusing the score scaling into the exponent's FMA), so a row's
bits would move with the chunking of its prefill. MASK_EVERY_TILE (batch-invariant mode)
walks every tile in the masked loop instead: tiles sit at absolute positions, tiles past a
row's position are exact no-ops, and so a row gets the same instructions on the same tiles
whatever query block it sits in.

Triton compiles a variant per value class of each integer and pointer argument (== 1,
divisible by 16, aligned). The arguments that vary from step to step only in such ways
(sequence counts, offsets, slices of the metadata) are kept out of that, so the variants a
server can meet are few and `TritonAttentionBackend.warm_up` compiles all of them."""
import inspect

import triton
import triton.language as tl

from parashift.kernels import pdl


def _jit_generic_in(*names: str):
    """triton.jit with `names` specialized neither on value nor on alignment."""
    options = {"do_not_specialize": names}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        options["do_not_specialize_on_alignment"] = names
    return triton.jit(**options)


# Running max before any visible key: finite, so fully masked rows give
# exp2(-inf - NEG_BIG) = 0 instead of NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                    stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HEADS_P: tl.constexpr, HEAD_DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, HEAD_DIM_P)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    src_k = k_ptr + token.to(tl.int64) * stride_kt + heads * stride_kh + dims
    src_v = v_ptr + token.to(tl.int64) * stride_vt + heads * stride_vh + dims
    dst_k = k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads * stride_kch + dims
    dst_v = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch + dims
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    tl.store(dst_k, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, token_offset, q_block, BLOCK_Q: tl.constexpr):
    """Largest i with (query_start_loc[i] - token_offset) // BLOCK_Q + i <= q_block."""
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_block = (tl.load(query_start_loc_ptr + mid) - token_offset) // BLOCK_Q + mid
        lo = tl.where(first_block <= q_block, mid, lo)
        hi = tl.where(first_block <= q_block, hi, mid - 1)
    return lo


@triton.jit
def _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table_ptr,
                  tile_lo, tile_hi, kv_end, q_pos, qk_scale,
                  stride_kb, stride_ks, stride_vb, stride_vs,
                  MASKED: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, ROW_SUM_BY_DOT: tl.constexpr = False):
    """Online softmax over KV tiles [tile_lo, tile_hi). Unmasked tiles lie
    wholly inside every row's causal window; MASKED ones need the check.
    ROW_SUM_BY_DOT (batch-invariant): a row's softmax denominator is summed by a dot with
    ones, the tensor cores' chain over the tile like the weighted values', instead of a
    reduction whose order follows the register layout (which the query rows per program
    and the warps change): then a decode program of few rows gives a prefill program's bits."""
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    for tile in range(tile_lo, tile_hi):
        pos = tile * TILE_N + offs_n
        if MASKED:
            n_ok = pos < kv_end
            block = tl.load(block_table_ptr + pos // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
            kv_mask = n_ok[:, None] & d_ok[None, :]
        else:
            block = tl.load(block_table_ptr + pos // BLOCK_SIZE).to(tl.int64)
            kv_mask = d_ok[None, :]
        in_block = pos % BLOCK_SIZE
        k_rows = k_base + block * stride_kb + in_block * stride_ks
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] < kv_end)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        if ROW_SUM_BY_DOT:
            ones = tl.full([TILE_N, 16], 1.0, q.dtype)
            row_sum = tl.max(tl.dot(p.to(q.dtype), ones, input_precision=DOT_PRECISION), 1)
        else:
            row_sum = tl.sum(p, 1)
        l_i = l_i * alpha + row_sum
        v_rows = v_base + block * stride_vb + in_block * stride_vs
        v = tl.load(v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _merge_partial(acc_run, m_run, l_run, acc, m, l):
    """Adds one KV partition's softmax state to the running one; the same arithmetic
    (explicit FMAs) in the kernels that merge in registers and from memory, so the bits do
    not depend on which does it. A partition no row sees (m at NEG_BIG) adds exactly 0."""
    m_new = tl.maximum(m_run, m)
    a = tl.exp2(m_run - m_new)
    b = tl.exp2(m - m_new)
    return tl.fma(acc, b[:, None], acc_run * a[:, None]), m_new, tl.fma(l, b, l_run * a)


@triton.jit
def _context_splits(seq_len, num_splits, SPLIT_TOKENS: tl.constexpr):
    """The splits a decode of seq_len tokens of context takes of the grid's num_splits."""
    return tl.minimum(num_splits, tl.maximum(tl.cdiv(seq_len, SPLIT_TOKENS), 1))


@triton.jit
def _split_tile_range(kv_end, first_q_pos, split, num_splits, TILE_N: tl.constexpr):
    """This split's tiles, cut where the causal mask starts to matter."""
    num_tiles = tl.cdiv(kv_end, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    lo = split * tiles_per_split
    hi = tl.minimum(lo + tiles_per_split, num_tiles)
    # tiles ending at or before the first query's position are visible to every row
    num_full = tl.minimum((first_q_pos + 1) // TILE_N, num_tiles)
    mid = tl.maximum(tl.minimum(hi, num_full), lo)
    return lo, mid, hi


@triton.jit
def _query_rows(first_token, tokens_left, first_pos, kv_head, GROUP: tl.constexpr,
                GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row r of a query block is token r // GROUP_P of the block and query head
    r % GROUP_P of the KV head's group; rows past the block, the sequence's
    tokens or the group are not real."""
    rows = tl.arange(0, BLOCK_M)
    row_token = rows // GROUP_P
    row_head = kv_head * GROUP + rows % GROUP_P
    row_ok = (row_token < BLOCK_Q) & (row_token < tokens_left) & (rows % GROUP_P < GROUP)
    token = (first_token + row_token).to(tl.int64)
    return token, row_head, row_ok, first_pos + row_token


@triton.jit
def _store_partial(part_acc_ptr, part_m_ptr, part_l_ptr, acc, m_i, l_i, row, row_head,
                   split, num_splits, row_ok, io_mask, offs_d, GROUP: tl.constexpr,
                   HEAD_DIM: tl.constexpr):
    """Partials live at [row, head, split] in buffers of shape
    [rows, num_heads, num_splits(, head_dim)]; acc stays unnormalised."""
    num_heads = tl.num_programs(1) * GROUP
    part_row = (row * num_heads + row_head) * num_splits + split
    tl.store(part_m_ptr + part_row, m_i, mask=row_ok)
    tl.store(part_l_ptr + part_row, l_i, mask=row_ok)
    acc_ptrs = part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(acc_ptrs, acc, mask=io_mask)


@_jit_generic_in("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_seqs",
                 "token_offset", "stride_bt")
def paged_attention_kernel(
        out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
        q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, token_offset, qk_scale,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr,
        BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, SPLIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, MASK_EVERY_TILE: tl.constexpr,
        PARTITION_TILES: tl.constexpr = 0, max_partitions=1, CONTEXT_SPLITS: tl.constexpr = 0,
        USE_PDL: tl.constexpr = False):
    pdl.start(USE_PDL)
    # the last query blocks see the longest contexts: start them first
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    seq = _find_sequence(query_start_loc_ptr, num_seqs, token_offset, q_block, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    block_q_start = (q_block - ((q_start - token_offset) // BLOCK_Q + seq)) * BLOCK_Q
    if block_q_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_start = seq_len - q_len
    used_splits = num_splits
    if CONTEXT_SPLITS > 0:  # decodes: splits of at least CONTEXT_SPLITS tokens, the rest exit
        used_splits = _context_splits(seq_len, num_splits, CONTEXT_SPLITS)
        if split >= used_splits:
            return

    token, row_head, row_ok, q_pos = _query_rows(q_start + block_q_start, q_len - block_q_start,
                                                 context_start + block_q_start, kv_head,
                                                 GROUP, GROUP_P, BLOCK_Q, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_P)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_rows = q_ptr + token * stride_qt + row_head * stride_qh
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)

    kv_end = context_start + tl.minimum(block_q_start + BLOCK_Q, q_len)
    lo, mid, hi = _split_tile_range(kv_end, context_start + block_q_start, split,
                                    used_splits, TILE_N)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    if PARTITION_TILES > 0:  # batch-invariant: KV in fixed partitions, merged in order
        acc, m_i, l_i = _attend_partitions(
            part_acc_ptr, part_m_ptr, part_l_ptr, q, k_base, v_base, block_table, kv_end,
            q_pos, qk_scale, stride_kb, stride_ks, stride_vb, stride_vs, token - token_offset,
            row_head, row_ok, io_mask, offs_d, split, num_splits, max_partitions, SPLIT,
            PARTITION_TILES, GROUP, BLOCK_M, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
            DOT_PRECISION)
        if SPLIT:
            return
    elif not MASK_EVERY_TILE:
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo, mid,
                                      kv_end, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                      stride_vs, False, TILE_N, BLOCK_SIZE, HEAD_DIM,
                                      HEAD_DIM_P, DOT_PRECISION)
        lo = mid
    if PARTITION_TILES == 0:
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo, hi,
                                      kv_end, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                      stride_vs, True, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
                                      DOT_PRECISION)
    pdl.inputs_read(USE_PDL)
    if SPLIT:
        _store_partial(part_acc_ptr, part_m_ptr, part_l_ptr, acc, m_i, l_i,
                       token - token_offset, row_head,
                       split, num_splits, row_ok, io_mask, offs_d, GROUP, HEAD_DIM)
    else:
        out = acc / l_i[:, None]
        o_rows = out_ptr + token * stride_ot + row_head * stride_oh
        tl.store(o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=io_mask)


@triton.jit
def _used_splits(seq_lens_ptr, num_seqs, NUM_SPLITS: tl.constexpr, CONTEXT_SPLITS: tl.constexpr):
    """The splits row program_id(0)'s sequence took: all but in a decode launch of
    CONTEXT_SPLITS (`_context_splits`)."""
    used_splits = NUM_SPLITS
    if CONTEXT_SPLITS > 0:
        i = tl.program_id(0)
        seq_len = tl.load(seq_lens_ptr + i, mask=i < num_seqs, other=1)
        used_splits = _context_splits(seq_len, NUM_SPLITS, CONTEXT_SPLITS)
    return used_splits


@_jit_generic_in("query_start_loc_ptr", "seq_lens_ptr", "num_seqs", "token_offset")
def reduce_splits_kernel(out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, query_start_loc_ptr,
                         seq_lens_ptr, num_seqs, token_offset, stride_ot, stride_oh,
                         NUM_SPLITS: tl.constexpr, NUM_SPLITS_P: tl.constexpr,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
                         CONTEXT_SPLITS: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
                         EARLY_LOADS: tl.constexpr = False):
    """Merges the splits of one (token, head); tokens past the last sequence
    (padding rows) get zeros. CONTEXT_SPLITS: a decode launch's (row i sequence i), whose
    sequences took only the splits their context needs (`_context_splits`). EARLY_LOADS: the
    metadata (the splits taken, the last row of a sequence), which no kernel of a step writes,
    is read before the wait, so the partial states' loads after it depend on nothing else."""
    if EARLY_LOADS:
        used_splits = _used_splits(seq_lens_ptr, num_seqs, NUM_SPLITS, CONTEXT_SPLITS)
        rows_end = tl.load(query_start_loc_ptr + num_seqs)
    pdl.start(USE_PDL)
    token = token_offset + tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    row = tl.program_id(0).to(tl.int64) * num_heads + head
    splits = tl.arange(0, NUM_SPLITS_P)
    if not EARLY_LOADS:
        used_splits = _used_splits(seq_lens_ptr, num_seqs, NUM_SPLITS, CONTEXT_SPLITS)
    s_ok = splits < used_splits
    m = tl.load(part_m_ptr + row * NUM_SPLITS + splits, mask=s_ok, other=NEG_BIG)
    l = tl.load(part_l_ptr + row * NUM_SPLITS + splits, mask=s_ok, other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    acc_ptrs = part_acc_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + offs_d[None, :]
    acc = tl.load(acc_ptrs, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(l * weight, 0)
    if not EARLY_LOADS:
        rows_end = tl.load(query_start_loc_ptr + num_seqs)
    is_real = token < rows_end
    pdl.inputs_read(USE_PDL)
    out = tl.where(is_real, out, 0.0)
    o_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _attend_partitions(part_acc_ptr, part_m_ptr, part_l_ptr, q, k_base, v_base, block_table,
                       kv_end, q_pos, qk_scale, stride_kb, stride_ks, stride_vb, stride_vs,
                       row, row_head, row_ok, io_mask, offs_d, split, num_splits,
                       max_partitions, SPLIT: tl.constexpr, PARTITION_TILES: tl.constexpr,
                       GROUP: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                       HEAD_DIM_P: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Batch-invariant split-KV: the context in partitions of PARTITION_TILES tiles at fixed
    positions, each from a fresh softmax state. Split, a program takes partitions split,
    split + num_splits, ... and stores each one's state (`reduce_partitions_kernel` merges
    them in order); unsplit, one program merges them in order itself: the same partial
    states, merged by the same arithmetic, so a row's bits do not depend on the split."""
    num_tiles = tl.cdiv(kv_end, TILE_N)
    num_parts = tl.cdiv(num_tiles, PARTITION_TILES)
    acc_run = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_run = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_run = tl.zeros([BLOCK_M], dtype=tl.float32)
    first = split if SPLIT else 0
    step = num_splits if SPLIT else 1
    for part in range(first, num_parts, step):
        lo = part * PARTITION_TILES
        hi = tl.minimum(lo + PARTITION_TILES, num_tiles)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo, hi,
                                      kv_end, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                      stride_vs, True, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
                                      DOT_PRECISION, ROW_SUM_BY_DOT=True)
        if SPLIT:
            _store_partial(part_acc_ptr, part_m_ptr, part_l_ptr, acc, m_i, l_i, row, row_head,
                           part, max_partitions, row_ok, io_mask, offs_d, GROUP, HEAD_DIM)
        else:
            acc_run, m_run, l_run = _merge_partial(acc_run, m_run, l_run, acc, m_i, l_i)
    return acc_run, m_run, l_run


@_jit_generic_in("query_start_loc_ptr", "seq_lens_ptr", "num_seqs", "token_offset")
def reduce_partitions_kernel(out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
                             query_start_loc_ptr, seq_lens_ptr, num_seqs, token_offset,
                             max_partitions, stride_ot, stride_oh,
                             TILE_N: tl.constexpr, PARTITION_TILES: tl.constexpr,
                             HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
                             USE_PDL: tl.constexpr = False):
    """Merges one decode row's partitions in order, as `_attend_partitions` does unsplit
    (a decode launch: row i is sequence i's one query); rows of no sequence get zeros."""
    pdl.start(USE_PDL)
    i = tl.program_id(0)
    token = token_offset + i
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    row = i.to(tl.int64) * num_heads + head
    is_real = token < tl.load(query_start_loc_ptr + num_seqs)
    seq_len = tl.load(seq_lens_ptr + i, mask=is_real & (i < num_seqs), other=0)
    num_parts = tl.cdiv(tl.cdiv(seq_len, TILE_N), PARTITION_TILES)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    one = tl.arange(0, 1)
    acc_run = tl.zeros([1, HEAD_DIM_P], dtype=tl.float32)
    m_run = tl.full([1], NEG_BIG, dtype=tl.float32)
    l_run = tl.zeros([1], dtype=tl.float32)
    for part in range(0, num_parts):
        at = row * max_partitions + part
        m = tl.load(part_m_ptr + at + one)
        l = tl.load(part_l_ptr + at + one)
        acc = tl.load(part_acc_ptr + at * HEAD_DIM + offs_d[None, :], mask=d_ok[None, :],
                      other=0.0)
        acc_run, m_run, l_run = _merge_partial(acc_run, m_run, l_run, acc, m, l)
    pdl.inputs_read(USE_PDL)
    out = acc_run / l_run[:, None]
    out = tl.where(is_real, out, 0.0)
    o_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_ok[None, :])
