"""Decode attention whose programs share the launch's KV tiles evenly (stream-K).

The one-launch kernel (triton_decode.py) gives a program a (row, KV head, split): at 64 rows
x 8 KV heads x one split, 512 programs of equal work fill the H200's ~396 resident slots 1.3
times, and the last 0.3 of a wave streams with a fraction of the SMs' loads in flight. Here
the grid is fixed (PROGRAMS per SM, for any batch and context) and the launch's KV tiles, in
(row, KV head, tile) order, are cut into one contiguous range a program: every program reads
the same number of tiles (give or take one) and they finish together.

A (row, KV head) unit whose tiles lie in one program's range is attended and written there.
A unit cut between programs gets a partial softmax state from each (slot 1 of the program it
starts in, slot 0 of the others: a program holds at most two cut units, its first and its
last), and the last of them to take its ticket (split_tickets.py) merges them in program
order and writes the output, setting the counter back to 0 (graph-safe, no fill).

The tile counts come from the sequence lengths on the device (each program sums them before
its PDL wait), so a CUDA graph captured for max_model_len runs a short context as a launch
for it would. Rows of no sequence count one tile, masked whole: their units write zeros.

Not batch-invariant: deterministic mode keeps `triton_kernels`' fixed partitions."""
import torch
import triton
import triton.language as tl

from parashift.attention.triton_decode import _store_rows
from parashift.attention.triton_kernels import NEG_BIG, _attend_tiles, _jit_generic_in
from parashift.kernels import pdl, split_tickets


@triton.jit
def _owner(x, programs, total):
    """The program whose range [p * total // programs, (p + 1) * total // programs) holds
    global tile x."""
    return ((x + 1) * programs - 1) // total


@triton.jit
def _pick(values, rows, r):
    """values[r] of a vector over rows."""
    return tl.sum(tl.where(rows == r, values, 0), 0)


@triton.jit
def _merge_pieces(part_acc_ptr, part_m_ptr, part_l_ptr, first_program, last_program,
                  GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr,
                  HEAD_DIM_P: tl.constexpr):
    """[GROUP_P, HEAD_DIM_P]: a unit's output from its pieces' partial states in program
    order (the first program's in its slot 1, the others' in slot 0), read from L2."""
    heads = tl.arange(0, GROUP_P)
    offs_d = tl.arange(0, HEAD_DIM_P)[None, :]
    ok = heads < GROUP
    acc_ok = ok[:, None] & (offs_d < HEAD_DIM)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    m = tl.full([GROUP_P], NEG_BIG, dtype=tl.float32)
    l = tl.zeros([GROUP_P], dtype=tl.float32)
    for prog in range(first_program, last_program + 1):
        slot = (prog * 2 + tl.where(prog == first_program, 1, 0)) * GROUP + heads
        m_s = tl.load(part_m_ptr + slot, mask=ok, other=NEG_BIG, cache_modifier=".cg")
        l_s = tl.load(part_l_ptr + slot, mask=ok, other=0.0, cache_modifier=".cg")
        acc_s = tl.load(part_acc_ptr + slot[:, None] * HEAD_DIM + offs_d, mask=acc_ok,
                        other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, m_s)
        a = tl.exp2(m - m_new)
        b = tl.exp2(m_s - m_new)
        acc = tl.fma(acc_s, b[:, None], acc * a[:, None])
        l = tl.fma(l_s, b, l * a)
        m = m_new
    return acc / tl.where(l > 0, l, 1.0)[:, None]  # a row of no sequence: 0


@_jit_generic_in("block_tables_ptr", "seq_lens_ptr", "num_seqs", "token_offset", "stride_bt")
def balanced_decode_kernel(
        out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, ticket_ptr,
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
        num_seqs, num_rows, token_offset, qk_scale,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
        BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, ROWS_P: tl.constexpr,
        DOT_PRECISION: tl.constexpr, ONE_TILE_LOOP: tl.constexpr = True,
        USE_PDL: tl.constexpr = False):
    """ONE_TILE_LOOP: a range's tiles in one masked loop (a context's partial last tile in
    the others' pipeline), else its whole tiles, then the partial one in a loop of its own."""
    program = tl.program_id(0).to(tl.int64)
    # what no kernel of this step writes, before the wait: the lengths, the tile ranges
    rows = tl.arange(0, ROWS_P)
    lens = tl.load(seq_lens_ptr + rows, mask=rows < num_seqs, other=0)
    tiles = tl.where(rows < num_rows, tl.maximum(tl.cdiv(lens, TILE_N), 1), 0)
    ends = tl.cumsum(tiles, 0).to(tl.int64) * NUM_KV_HEADS
    total = tl.sum(tiles, 0).to(tl.int64) * NUM_KV_HEADS
    # at most a program a tile: each program's range is then not empty, and a cut unit's
    # pieces are the programs from its first tile's to its last's
    programs = tl.minimum(tl.num_programs(0).to(tl.int64), total)
    g = program * total // programs
    g_end = tl.where(program < programs, (program + 1) * total // programs, g)
    pdl.start(USE_PDL)

    offs_g = tl.arange(0, BLOCK_M)
    g_ok = offs_g < GROUP
    offs_d = tl.arange(0, HEAD_DIM_P)
    io_mask = g_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    while g < g_end:
        # the unit (row, KV head) holding tile g, and its tiles [lo, hi) in this program
        row = tl.sum((ends <= g).to(tl.int32), 0)
        row_tiles = _pick(tiles, rows, row).to(tl.int64)
        seq_len = _pick(lens, rows, row)
        row_start = _pick(ends, rows, row) - row_tiles * NUM_KV_HEADS
        kv_head = (g - row_start) // row_tiles
        unit_start = row_start + kv_head * row_tiles
        lo = (g - unit_start).to(tl.int32)
        hi = tl.minimum(row_tiles, g_end - unit_start).to(tl.int32)

        token = token_offset + row.to(tl.int64)
        head = kv_head * GROUP + offs_g
        q = tl.load(q_ptr + token * stride_qt + (head * stride_qh)[:, None] + offs_d[None, :],
                    mask=io_mask, other=0.0)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        block_table = block_tables_ptr + row.to(tl.int64) * stride_bt
        k_base = k_cache_ptr + kv_head * stride_kh
        v_base = v_cache_ptr + kv_head * stride_vh
        q_pos = tl.full([BLOCK_M], 0, tl.int32) + (seq_len - 1)
        if ONE_TILE_LOOP:
            mid = lo
        else:  # the whole tiles first
            mid = tl.maximum(tl.minimum(hi, seq_len // TILE_N), lo)
            acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, lo,
                                          mid, seq_len, q_pos, qk_scale, stride_kb, stride_ks,
                                          stride_vb, stride_vs, False, TILE_N, BLOCK_SIZE,
                                          HEAD_DIM, HEAD_DIM_P, DOT_PRECISION)
        acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, k_base, v_base, block_table, mid, hi,
                                      seq_len, q_pos, qk_scale, stride_kb, stride_ks,
                                      stride_vb, stride_vs, True, TILE_N, BLOCK_SIZE,
                                      HEAD_DIM, HEAD_DIM_P, DOT_PRECISION)
        o_ptrs = out_ptr + token * stride_ot + (head * stride_oh)[:, None] + offs_d[None, :]
        if (lo == 0) & (hi == row_tiles.to(tl.int32)):  # the whole unit here
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row of no sequence: 0
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)
        else:
            # slot 1: the unit starts here and goes on; slot 0: it started before
            slot = (program * 2 + (lo == 0).to(tl.int64)) * GROUP + offs_g
            tl.store(part_m_ptr + slot, m_i, mask=g_ok)
            tl.store(part_l_ptr + slot, l_i, mask=g_ok)
            tl.store(part_acc_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc,
                     mask=io_mask)
            first = _owner(unit_start, programs, total)
            last = _owner(unit_start + row_tiles - 1, programs, total)
            counter = ticket_ptr + row * NUM_KV_HEADS + kv_head
            if split_tickets.is_last_of(counter, (last - first + 1).to(tl.int32)):
                split_tickets.reset(counter)
                out = _merge_pieces(part_acc_ptr, part_m_ptr, part_l_ptr, first, last, GROUP,
                                    GROUP_P, HEAD_DIM, HEAD_DIM_P)
                _store_rows(out_ptr, token, kv_head, stride_ot, stride_oh, out, GROUP, GROUP_P,
                            HEAD_DIM, HEAD_DIM_P)
        g += (hi - lo).to(tl.int64)
    pdl.inputs_read(USE_PDL)


def launch(out, q, k_cache, v_cache, block_tables, seq_lens, num_seqs: int, num_rows: int,
           token_offset: int, qk_scale: float, config, group: int, group_p: int,
           programs: int, tickets, dot_precision: str, rows_p: int, one_tile_loop: bool,
           max_registers: int, pdl_options: dict) -> None:
    """Attention of `num_rows` one-row decodes (the first num_seqs real, from token_offset)
    into out over `programs` programs; tickets: num_rows x KV heads counters, all 0; rows_p:
    the fewest rows a launch compiles for (one variant up to it); max_registers: a thread's
    (0: the compiler's choice)."""
    num_kv_heads, head_dim = k_cache.shape[2], q.shape[2]
    part_m = torch.empty(programs * 2 * group, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(programs * 2 * group, head_dim, dtype=torch.float32,
                           device=q.device)
    balanced_decode_kernel[(programs,)](
        out, part_acc, part_m, part_l, tickets, q, k_cache, v_cache, block_tables, seq_lens,
        num_seqs, num_rows, token_offset, qk_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_P=group_p, BLOCK_M=config.block_m,
        TILE_N=config.tile_n, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
        ROWS_P=max(rows_p, triton.next_power_of_2(num_rows)), DOT_PRECISION=dot_precision,
        ONE_TILE_LOOP=one_tile_loop,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({"maxnreg": max_registers} if max_registers else {}), **pdl_options)
