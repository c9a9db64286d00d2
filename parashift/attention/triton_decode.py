"""Decode attention in one launch: split-KV whose reduction runs in the split programs, and
whose split count follows each sequence's context on the device.

A decode launch (every sequence one query row, rows of no sequence after them) takes a grid
of (rows, KV heads, splits). Program (i, h, s) attends row i's query heads of KV head h to
split s of sequence i's context (HEADS_FIRST: the grid's first two axes swapped). The
grid's split count is fixed on the host (for a CUDA graph: at capture, for max_model_len); a sequence takes only
min(splits, ceil(context / SPLIT_TOKENS)) of them, its tiles cut evenly among those, and
the programs past them exit at once: a 1,024-token context in a graph captured for 8,192
runs as a launch for 1,024 would. A sequence of one split writes its output directly; with
more, each program stores its partial softmax state and takes a ticket (split_tickets.py),
and the last of the row's splits to finish merges them (in split order: the same bits
whatever order the programs ran in), writes the output and sets the counter back
to 0 for the next launch (no fill: graph-safe). Rows of no sequence get zeros from their
split-0 programs, so a graph's padded output needs no fill either.

The backend takes it for launches of at most FUSED_MAX_SPLITS splits: the merge is one
program's, its loads split after split, and at batch 1 over 32 splits it cost more than the
split kernel's separate reduction launch (triton_backend.py has the numbers).

Not batch-invariant: deterministic mode keeps `triton_kernels`' fixed partitions."""
import triton
import triton.language as tl

from parashift.attention.triton_fp8_values import attend_tiles_fp8, joined, zero_halves
from parashift.attention.triton_kernels import NEG_BIG, _attend_tiles, _jit_generic_in
from parashift.kernels import pdl, split_tickets


@triton.jit
def _merge_splits(part_acc_ptr, part_m_ptr, part_l_ptr, first, grid_splits, num_splits,
                  GROUP: tl.constexpr, GROUP_P: tl.constexpr, SPLITS_P: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr):
    """[GROUP_P, HEAD_DIM_P]: the group's heads' outputs from their num_splits partial states
    (head g's split s at first + g * grid_splits + s, read from L2), merged in split order.
    Each split's m and l are loaded broadcast over the head's dims: the merge is elementwise,
    with no barrier or store between the splits, so their loads can be issued together."""
    heads = tl.arange(0, GROUP_P)[:, None]
    offs_d = tl.arange(0, HEAD_DIM_P)[None, :]
    ok = (heads < GROUP) & (offs_d < HEAD_DIM)
    part = first + heads * grid_splits
    across_d = offs_d * 0
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    m = tl.full([GROUP_P, HEAD_DIM_P], NEG_BIG, dtype=tl.float32)
    l = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    for s in tl.static_range(SPLITS_P):
        s_ok = ok & (heads * 0 + s < num_splits)
        m_s = tl.load(part_m_ptr + part + s + across_d, mask=s_ok, other=NEG_BIG,
                      cache_modifier=".cg")
        l_s = tl.load(part_l_ptr + part + s + across_d, mask=s_ok, other=0.0,
                      cache_modifier=".cg")
        acc_s = tl.load(part_acc_ptr + (part + s) * HEAD_DIM + offs_d, mask=s_ok, other=0.0,
                        cache_modifier=".cg")
        m_new = tl.maximum(m, m_s)
        a = tl.exp2(m - m_new)
        b = tl.exp2(m_s - m_new)
        acc = tl.fma(acc_s, b, acc * a)
        l = tl.fma(l_s, b, l * a)
        m = m_new
    return acc / l


@triton.jit
def _split_tiles(seq_len, split, grid_splits, TILE_N: tl.constexpr, SPLIT_TOKENS: tl.constexpr):
    """(the sequence's splits, its tiles, tiles a split, this split's first tile, its end)."""
    num_splits = tl.minimum(grid_splits, tl.maximum(tl.cdiv(seq_len, SPLIT_TOKENS), 1))
    num_tiles = tl.cdiv(seq_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    lo = split * tiles_per_split
    return num_splits, num_tiles, tiles_per_split, lo, tl.minimum(lo + tiles_per_split, num_tiles)


@triton.jit
def _store_rows(out_ptr, token, kv_head, stride_ot, stride_oh, values, GROUP: tl.constexpr,
                GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr):
    """values [GROUP_P, HEAD_DIM_P] into the output row's heads of the KV head's group."""
    heads = tl.arange(0, GROUP_P)
    offs_d = tl.arange(0, HEAD_DIM_P)
    ptrs = (out_ptr + token * stride_ot + (kv_head * GROUP + heads)[:, None] * stride_oh
            + offs_d[None, :])
    mask = (heads < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(ptrs, values.to(out_ptr.dtype.element_ty), mask=mask)


@_jit_generic_in("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_seqs",
                 "token_offset", "stride_bt")
def decode_attention_kernel(
        out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, ticket_ptr,
        q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, token_offset, qk_scale,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_M: tl.constexpr,
        TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
        HEAD_DIM_P: tl.constexpr, SPLITS_P: tl.constexpr, SPLIT_TOKENS: tl.constexpr,
        DOT_PRECISION: tl.constexpr, HEADS_FIRST: tl.constexpr = False,
        USE_PDL: tl.constexpr = False, FP8_PAIRS: tl.constexpr = False,
        FP8_F16: tl.constexpr = False):
    """FP8_PAIRS: an FP8 pool's values read as 16-bit pairs (triton_fp8_values.py); FP8_F16:
    its products in fp16 (one conversion from E4M3, not two), q clamped to fp16's range."""
    # HEADS_FIRST: the grid is (KV heads, rows, splits), a row's heads launched together
    i = tl.program_id(1 if HEADS_FIRST else 0)
    kv_head = tl.program_id(0 if HEADS_FIRST else 1)
    num_kv_heads = tl.num_programs(0 if HEADS_FIRST else 1)
    split = tl.program_id(2)
    grid_splits = tl.num_programs(2)
    token = (token_offset + i).to(tl.int64)
    # every load that needs nothing loaded before it, issued together (one latency, not three);
    # the metadata was copied before the step's first kernel: read before the PDL wait
    is_seq = i < num_seqs
    q_start = tl.load(query_start_loc_ptr + i, mask=is_seq, other=0)
    q_end = tl.load(query_start_loc_ptr + i + 1, mask=is_seq, other=0)
    seq_len = tl.load(seq_lens_ptr + i, mask=is_seq, other=0)
    pdl.start(USE_PDL)
    rows = tl.arange(0, BLOCK_M)
    row_head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    offs_d = tl.arange(0, HEAD_DIM_P)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_rows = q_ptr + token * stride_qt + row_head * stride_qh
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)
    if q_end == q_start:  # a row of no sequence
        if split == 0:
            _store_rows(out_ptr, token, kv_head, stride_ot, stride_oh,
                        tl.zeros([GROUP_P, HEAD_DIM_P], tl.float32), GROUP, GROUP_P, HEAD_DIM,
                        HEAD_DIM_P)
        return
    num_splits, num_tiles, tiles_per_split, lo, hi = _split_tiles(seq_len, split, grid_splits,
                                                                  TILE_N, SPLIT_TOKENS)
    if split >= num_splits:
        return
    mid = tl.maximum(tl.minimum(hi, seq_len // TILE_N), lo)  # tiles before the last partial
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + (seq_len - 1)

    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    block_table = block_tables_ptr + i.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    if FP8_PAIRS:
        if FP8_F16:
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        acc_even, acc_odd = zero_halves(BLOCK_M, HEAD_DIM)
        acc_even, acc_odd, m_i, l_i = attend_tiles_fp8(
            acc_even, acc_odd, m_i, l_i, q, k_base, v_base, block_table, lo, mid, seq_len,
            q_pos, qk_scale, stride_kb, stride_ks, stride_vb, stride_vs, False, TILE_N,
            BLOCK_SIZE, HEAD_DIM, DOT_PRECISION)
        acc_even, acc_odd, m_i, l_i = attend_tiles_fp8(
            acc_even, acc_odd, m_i, l_i, q, k_base, v_base, block_table, mid, hi, seq_len,
            q_pos, qk_scale, stride_kb, stride_ks, stride_vb, stride_vs, True, TILE_N,
            BLOCK_SIZE, HEAD_DIM, DOT_PRECISION)
        acc = joined(acc_even, acc_odd, BLOCK_M, HEAD_DIM)
    else:
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo, mid,
                                      seq_len, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                      stride_vs, False, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
                                      DOT_PRECISION)
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, mid, hi,
                                      seq_len, q_pos, qk_scale, stride_kb, stride_ks, stride_vb,
                                      stride_vs, True, TILE_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_P,
                                      DOT_PRECISION)
    pdl.inputs_read(USE_PDL)
    o_rows = out_ptr + token * stride_ot + row_head * stride_oh
    if num_splits == 1:
        out = acc / l_i[:, None]
        tl.store(o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=io_mask)
        return
    # partials at [row, head, split] of buffers [rows, heads, grid_splits(, head_dim)]
    num_heads = num_kv_heads * GROUP
    first_part = (i.to(tl.int64) * num_heads + row_head) * grid_splits
    part_row = first_part + split
    tl.store(part_m_ptr + part_row, m_i, mask=row_ok)
    tl.store(part_l_ptr + part_row, l_i, mask=row_ok)
    tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=io_mask)
    counter = ticket_ptr + i * num_kv_heads + kv_head
    if split_tickets.is_last_of(counter, num_splits):
        split_tickets.reset(counter)
        first = (i.to(tl.int64) * num_heads + kv_head * GROUP) * grid_splits
        out = _merge_splits(part_acc_ptr, part_m_ptr, part_l_ptr, first, grid_splits, num_splits,
                            GROUP, GROUP_P, SPLITS_P, HEAD_DIM, HEAD_DIM_P)
        _store_rows(out_ptr, token, kv_head, stride_ot, stride_oh, out, GROUP, GROUP_P,
                    HEAD_DIM, HEAD_DIM_P)
