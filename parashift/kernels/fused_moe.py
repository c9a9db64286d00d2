"""The experts of a mixture-of-experts layer as two grouped GEMMs over the token-expert
pairs sorted by expert, with no host sync (CUDA-graph capturable): what
parashift.layers.fused_moe.expert_outputs computes.

The pairs (token t's j-th choice is pair t*k + j) are laid out expert by expert, each
expert's run padded to a multiple of BLOCK_M rows, in a buffer of a size known from the
shapes alone (every pair, plus BLOCK_M - 1 padding rows per expert); a padding row holds
the sentinel pair id N. Each program of the GEMM takes BLOCK_M rows of one expert and one
tile of output columns; blocks past the last expert's run exit at once. Pairs routed to
experts held elsewhere (expert parallelism) get no row and add nothing. The first GEMM
writes [gate | up] per pair, SiLU·mul follows (kernels/silu_mul.py), the second writes each
pair's down projection times its routing weight, and the k pairs of a token are summed in
a fixed order (no atomics)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import (moe_decode, moe_prefill, moe_routing, moe_schedule,
                               moe_small, pdl)

BLOCK_M = 16
MANY_ROWS_BLOCK_M = 64  # rows per program where experts average many pairs (prefill)


def block_rows(num_pairs: int, num_local: int) -> int:
    """Rows per program: 64 (tensor-core tiles of 64 rows) once the experts average 64
    pairs or more, else 16 so a decode's few pairs per expert pad little (on an H200 a
    4096-token prefill of Qwen3-30B-A3B, 256 pairs per expert, took 0.70× the time with
    64 rows; a 512-token one, 32 per expert, 1.07×)."""
    return MANY_ROWS_BLOCK_M if num_pairs >= 64 * num_local else BLOCK_M


@triton.jit
def _grouped_gemm_kernel(out_ptr, a_ptr, w_ptr, w_desc, pair_ptr, block_expert_ptr, weight_ptr,
                         scale_ptr, num_pairs, num_experts, n_out, k_in, a_row_div, part_rows,
                         stride_a, stride_we, stride_wp, stride_wn, stride_out,
                         stride_se, stride_sp, stride_sn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         MUL_WEIGHT: tl.constexpr, IEEE: tl.constexpr, W_SCALED: tl.constexpr,
                         N_FIRST: tl.constexpr = 0, SPLIT_TAIL: tl.constexpr = 0,
                         TMA: tl.constexpr = 0, USE_PDL: tl.constexpr = 0):
    pdl.start(USE_PDL)  # which expert a block reads is the sort's output
    block, n_tile = moe_schedule.block_and_column_tile(N_FIRST)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    if not SPLIT_TAIL:
        _grouped_gemm_tile(out_ptr, a_ptr, w_ptr, w_desc, pair_ptr, weight_ptr, scale_ptr,
                           expert, n_tile, num_pairs, n_out, k_in, a_row_div, part_rows,
                           stride_a, stride_we, stride_wp, stride_wn, stride_out, stride_se,
                           stride_sp, stride_sn, block, BLOCK_M, BLOCK_N, BLOCK_K, MUL_WEIGHT,
                           IEEE, W_SCALED, TMA, USE_PDL)
    elif moe_schedule.tail_block(pair_ptr, block, num_pairs, BLOCK_M):
        # the expert's last rows fill half the block or less: half a block's GEMM
        _grouped_gemm_tile(out_ptr, a_ptr, w_ptr, w_desc, pair_ptr, weight_ptr, scale_ptr,
                           expert, n_tile, num_pairs, n_out, k_in, a_row_div, part_rows,
                           stride_a, stride_we, stride_wp, stride_wn, stride_out, stride_se,
                           stride_sp, stride_sn, 2 * block, BLOCK_M // 2, BLOCK_N, BLOCK_K,
                           MUL_WEIGHT, IEEE, W_SCALED, TMA, USE_PDL)
    else:
        _grouped_gemm_tile(out_ptr, a_ptr, w_ptr, w_desc, pair_ptr, weight_ptr, scale_ptr,
                           expert, n_tile, num_pairs, n_out, k_in, a_row_div, part_rows,
                           stride_a, stride_we, stride_wp, stride_wn, stride_out, stride_se,
                           stride_sp, stride_sn, block, BLOCK_M, BLOCK_N, BLOCK_K, MUL_WEIGHT,
                           IEEE, W_SCALED, TMA, USE_PDL)


@triton.jit
def _grouped_gemm_tile(out_ptr, a_ptr, w_ptr, w_desc, pair_ptr, weight_ptr, scale_ptr, expert,
                       n_tile, num_pairs, n_out, k_in, a_row_div, part_rows,
                       stride_a, stride_we, stride_wp, stride_wn, stride_out,
                       stride_se, stride_sp, stride_sn, block,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       MUL_WEIGHT: tl.constexpr, IEEE: tl.constexpr, W_SCALED: tl.constexpr,
                       TMA: tl.constexpr, USE_PDL: tl.constexpr):
    """BLOCK_M sorted rows (the block-th run of BLOCK_M) times BLOCK_N output columns; TMA:
    the weights by the descriptor of their [E * n, k] view (one part)."""
    pairs, valid, a_rows = moe_routing.block_pairs(pair_ptr, block, num_pairs, a_row_div,
                                                   BLOCK_M)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    # output column c is row c % part_rows of part c // part_rows of the expert's weight
    w_rows = (cols // part_rows) * stride_wp + (cols % part_rows) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * stride_a + ks[None, :],
                    mask=valid[:, None] & (ks[None, :] < k_in), other=0.0)
        if TMA:
            w = tl.trans(w_desc.load([expert.to(tl.int32) * n_out + n_tile * BLOCK_N, k0]))
        else:
            w = tl.load(w_base + w_rows[None, :] + ks[:, None],
                        mask=(cols[None, :] < n_out) & (ks[:, None] < k_in), other=0.0)
        if W_SCALED:  # E4M3 weights: exact in the activations' dtype, scaled after the sum
            w = w.to(a_ptr.dtype.element_ty)
        if IEEE:  # fp32 inputs: no TF32
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    if W_SCALED:
        col_scale = tl.load(scale_ptr + expert.to(tl.int64) * stride_se
                            + (cols // part_rows) * stride_sp + (cols % part_rows) * stride_sn,
                            mask=cols < n_out, other=0.0)
        acc = acc * col_scale[None, :]
    if MUL_WEIGHT:
        scale = tl.load(weight_ptr + pairs, mask=valid, other=0.0)
        acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32) * scale.to(tl.float32)[:, None]
    pdl.inputs_read(USE_PDL)
    tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < n_out))


def sort_pairs(ids: torch.Tensor, num_local: int, first_expert: int, block_m: int = BLOCK_M
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair id of each row [rows], expert of each block of block_m rows [rows / block_m],
    num_local for blocks past the end), from device ops only: the sizes follow from the
    shapes, nothing is read on the host. On CUDA the Triton kernels of `moe_routing`."""
    if ids.is_cuda and moe_routing.sort_fits(ids.numel(), num_local):
        return moe_routing.sort_pairs(ids, num_local, first_expert, block_m)
    return sort_pairs_torch(ids, num_local, first_expert, block_m)


def sort_pairs_torch(ids: torch.Tensor, num_local: int, first_expert: int,
                     block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """sort_pairs in torch ops (any size; the reference of the one-launch kernel)."""
    num_pairs = ids.numel()
    rows = num_pairs + num_local * (block_m - 1)
    rows = (rows + block_m - 1) // block_m * block_m
    local = ids.flatten() - first_expert
    held = (local >= 0) & (local < num_local)
    local = torch.where(held, local, num_local)  # pairs held elsewhere: a last, dropped bin
    counts = torch.zeros(num_local + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, local, torch.ones_like(local))
    padded = (counts[:num_local] + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = local.argsort(stable=True)
    sorted_experts = local[order]
    start = counts.cumsum(0) - counts  # of each expert's pairs in `order`
    within = torch.arange(num_pairs, device=ids.device) - start[sorted_experts]
    row_start = torch.cat([padded_end.new_zeros(1), padded_end])  # expert num_local: past all
    dest = torch.where(sorted_experts < num_local, row_start[sorted_experts] + within, rows)
    pair_of_row = torch.full((rows + 1,), num_pairs, dtype=torch.int64, device=ids.device)
    pair_of_row.scatter_(0, dest, order)
    block_starts = torch.arange(0, rows, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    return pair_of_row[:rows], block_expert


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, pair_of_row: torch.Tensor,
                 block_expert: torch.Tensor, num_pairs: int, a_row_div: int,
                 weights: torch.Tensor | None = None, tiles: tuple | None = None,
                 w_scale: torch.Tensor | None = None, zero: bool = True,
                 schedule: dict | None = None) -> torch.Tensor:
    """[num_pairs, n] with row p = a[p // a_row_div] @ w[expert of p]^T (times weights[p]);
    rows of pairs with no expert here are zero (unwritten where `zero` is False). w is
    [E, n, k], or [E, parts, n / parts, k] (a narrowed layout's gate and up slices: a
    strided view, read in place). FP8 weights come with `w_scale`, one per output row:
    [E, n, 1] or [E, parts, n / parts, 1]. `schedule`: kernels/moe_schedule.py's flags (None:
    all off)."""
    schedule = schedule or {}
    stacked = w
    if w.dim() == 3:
        w = w.unsqueeze(1)
        w_scale = None if w_scale is None else w_scale.unsqueeze(1)
    if w.stride(3) != 1:
        w = w.contiguous()
    if (w_scale is not None) != (w.dtype != a.dtype):
        raise ValueError(f"weights in {w.dtype} for activations in {a.dtype} need a scale "
                         "per output row (FP8), and only they")
    part_rows, k_in = w.shape[2], w.shape[3]
    n_out = w.shape[1] * part_rows
    a = a.contiguous()
    out = (torch.zeros if zero else torch.empty)(num_pairs, n_out, dtype=a.dtype,
                                                 device=a.device)
    block_m = pair_of_row.numel() // block_expert.numel()
    block_n, block_k, warps, stages = tiles or gemm_tiles(block_m, n_out, k_in)
    grid, n_first = moe_schedule.grid(block_expert.numel(), triton.cdiv(n_out, block_n),
                                      schedule.get("n_first", 0))
    w_desc = moe_schedule.weight_descriptor(stacked, a, block_n, block_k, schedule.get("tma", 0))
    scale_strides = (0, 0, 0) if w_scale is None else w_scale.stride()[:3]
    _grouped_gemm_kernel[grid](
        out, a, w, w_desc, pair_of_row, block_expert, weights if weights is not None else out,
        w_scale if w_scale is not None else out,
        num_pairs, w.shape[0], n_out, k_in, a_row_div, part_rows, a.stride(0), w.stride(0),
        w.stride(1), w.stride(2), out.stride(0), *scale_strides, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, MUL_WEIGHT=weights is not None,
        IEEE=a.dtype == torch.float32, W_SCALED=w_scale is not None, N_FIRST=n_first,
        SPLIT_TAIL=int(bool(schedule.get("split_tail", 0)) and block_m >= 32),
        TMA=int(w_desc is not None), num_warps=warps, num_stages=stages,
        **pdl.launch_options(a.device))
    return out


def gemm_tiles(block_m: int, n_out: int, k_in: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, warps, stages) of the grouped GEMM. 16 rows: the fastest or within
    2% of it for the Qwen3-30B-A3B shape's two GEMMs at 1, 8 and 64 tokens on an H200
    (2026-11-23; 64×64, 4 warps, 3 stages was 1.3× slower at 1 token); 64 rows: a
    prefill's."""
    if block_m >= MANY_ROWS_BLOCK_M:
        return (min(128, max(16, triton.next_power_of_2(n_out))),
                min(64, max(16, triton.next_power_of_2(k_in))), 4, 3)
    return (min(64, max(16, triton.next_power_of_2(n_out))),
            min(128, max(16, triton.next_power_of_2(k_in))), 2, 4)


def fused_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                  scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """expert_outputs(x, weights, ids, gate_up, down, first_expert) on the device; FP8
    experts read as they are stored, with `scales` (gate_up's, down's) per output row. A
    few pairs (decode at one or two tokens, FP8 experts up to sixteen) take
    kernels/moe_small.py's GEMVs."""
    if moe_small.takes(ids.numel(), fp8=scales is not None):
        return moe_small.small_experts(x, weights, ids, gate_up, down, first_expert, scales)
    return grouped_experts(x, weights, ids, gate_up, down, first_expert, scales)


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                    scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """fused_experts by the two grouped GEMMs, at any number of pairs; prefill-sized batches
    by `prefill_experts` (unless PARASHIFT_MOE_PREFILL=0), decode-sized ones by its kernels
    at 16-row tiles (kernels/moe_decode.py; unless PARASHIFT_MOE_DECODE_FUSED=0)."""
    gate_up_scale, down_scale = scales or (None, None)
    from parashift.kernels.silu_mul import silu_and_mul
    tokens, top_k = ids.shape
    num_pairs = ids.numel()
    block_m = block_rows(num_pairs, gate_up.shape[0])
    if block_m == MANY_ROWS_BLOCK_M and moe_prefill.enabled():
        return prefill_experts(x, weights, ids, gate_up, down, first_expert, scales)
    if block_m == BLOCK_M and moe_decode.enabled():
        return prefill_experts(x, weights, ids, gate_up, down, first_expert, scales,
                               moe_decode.tiles_for(down.shape[-1], down.shape[1]))
    pair_of_row, block_expert = sort_pairs(ids, gate_up.shape[0], first_expert, block_m)
    h = silu_and_mul(grouped_gemm(x, gate_up, pair_of_row, block_expert, num_pairs, top_k,
                                  w_scale=gate_up_scale))
    y = grouped_gemm(h, down, pair_of_row, block_expert, num_pairs, 1,
                     weights.flatten().contiguous(), w_scale=down_scale)
    return y.view(tokens, top_k, -1).sum(dim=1)


def prefill_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                    tiles: dict | None = None) -> torch.Tensor:
    """grouped_experts without fills, SiLU·mul in the gate_up GEMM, the top-k sum a kernel
    of its own (kernels/moe_prefill.py); `tiles` as moe_prefill.tiles_for gives them."""
    num_local, num_pairs = gate_up.shape[0], ids.numel()
    tiles = (moe_prefill.check_tiles(tiles) if tiles
             else moe_prefill.tiles_for(x.device, num_pairs / num_local))
    gate_up_scale, down_scale = scales or (None, None)
    pair_of_row, block_expert = sort_pairs(ids, num_local, first_expert, tiles["block_m"])
    schedule = moe_schedule.flags(tiles)
    h = moe_prefill.gate_up_silu(x, gate_up, pair_of_row, block_expert, num_pairs,
                                 ids.shape[1], tiles["gate_up"], gate_up_scale, schedule)
    y = grouped_gemm(h, down, pair_of_row, block_expert, num_pairs, 1,
                     weights.flatten().contiguous(), tiles["down"], down_scale, zero=False,
                     schedule=schedule)
    return moe_prefill.topk_sum(y, ids, first_expert, num_local)
