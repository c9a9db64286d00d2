"""The experts of a prefill-sized batch (64+ pairs per expert on average) in three launches
after the pair sort, none of them a fill: what kernels/fused_moe.grouped_experts computes
with five (a zeroed [gate | up], SiLU·mul, a zeroed down output, torch's top-k sum).

1. `_gate_up_silu_kernel`: each program takes BLOCK_M sorted rows of one expert and BLOCK_N
   columns of the intermediate width, runs the gate and the up GEMM side by side (two
   accumulators) and writes silu(gate) * up, rounded as the unfused path rounds (each GEMM
   to the activations' dtype, then kernels/silu_mul.silu_mul_values).
2. The grouped GEMM of kernels/fused_moe.py writes each pair's down projection times its
   routing weight; rows of pairs held by no expert here (expert parallelism) stay unwritten.
3. `_topk_sum_kernel`: each token's k pairs added in slot order in fp32, a pair routed to an
   expert held elsewhere skipped (reads its ids, so no row needs zeroing).

Tiles: the table TILES (per device name, chosen by benchmarks/moe_prefill.py's sweep), or a
JSON file of the sweep's (PARASHIFT_MOE_PREFILL_TILES=path); PARASHIFT_MOE_PREFILL=0 sends
prefill batches back to grouped_experts' unfused path (read at each call)."""
import functools
import json
import os

import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import moe_routing, moe_schedule, pdl
from parashift.kernels.silu_mul import silu_mul_values

ENV, TILES_ENV = "PARASHIFT_MOE_PREFILL", "PARASHIFT_MOE_PREFILL_TILES"
# block_m, then (BLOCK_N, BLOCK_K, warps, stages) of gate_up and of down, and any of
# kernels/moe_schedule.py's flags (a missing one off); DEFAULT_TILES
# where the table has no row for the device: the unfused path's 64-row tiles
DEFAULT_TILES = {"block_m": 64, "gate_up": (64, 64, 4, 3), "down": (128, 64, 4, 3)}
# device name -> tiles, from a sweep on that device (benchmarks/moe_prefill.py, Qwen3-30B-A3B at
# 4,096 tokens, 256 pairs an expert). H200 (session 47, benchmarks/results/raw/moepf_call1/):
# column tiles first and half blocks at the tails; the experts call 0.880 ms a layer against
# 0.970 with session 42's row (gate_up 0.552 -> 0.490 ms, down 0.326 -> 0.262), the 4,096-token
# prefill 70.3 against 74.3 ms in one engine
TILES: dict[str, dict] = {
    "NVIDIA H200": {"block_m": 128, "gate_up": (128, 64, 8, 4), "down": (256, 64, 8, 4),
                    "n_first": 1, "split_tail": 1},
}


def enabled() -> bool:
    return switch(ENV, "1")


def tiles_for(device: torch.device, pairs_per_expert: float | None = None) -> dict:
    """{"block_m", "gate_up", "down"}: the file PARASHIFT_MOE_PREFILL_TILES names, else the
    table's row for this device where the experts average at least its block_m pairs (a
    block longer than an expert's run pads it: the sweep ran at 256 an expert), else
    DEFAULT_TILES."""
    path = os.environ.get(TILES_ENV)
    if path:
        return _tiles_file(path)
    tiles = TILES.get(_device_name(device.type, device.index), DEFAULT_TILES)
    if pairs_per_expert is not None and pairs_per_expert < tiles["block_m"]:
        return DEFAULT_TILES
    return tiles


@functools.cache
def _device_name(kind: str, index: int | None) -> str:
    return torch.cuda.get_device_name(index) if kind == "cuda" else kind


@functools.cache
def _tiles_file(path: str) -> dict:
    with open(path) as f:
        tiles = json.load(f)
    try:
        return check_tiles({"block_m": tiles["block_m"], "gate_up": tuple(tiles["gate_up"]),
                            "down": tuple(tiles["down"]),
                            **{k: tiles[k] for k in moe_schedule.FLAGS if k in tiles}})
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{TILES_ENV}={path}: expected block_m, gate_up and down "
                         f"(BLOCK_N, BLOCK_K, warps, stages) and any of "
                         f"{moe_schedule.FLAGS}, got {tiles}") from exc


def check_tiles(tiles: dict) -> dict:
    numbers = [tiles["block_m"], *tiles["gate_up"], *tiles["down"]]
    powers = numbers[:4] + numbers[5:8]  # all but the stages
    if len(numbers) != 9 or any(n < 1 or n & (n - 1) for n in powers) or min(numbers) < 1 \
            or tiles["block_m"] < 16:
        raise ValueError("MoE prefill tiles must be powers of two (block_m >= 16; stages "
                         f">= 1), got {tiles}")
    unknown = set(tiles) - {"block_m", "gate_up", "down", *moe_schedule.FLAGS}
    if unknown:
        raise ValueError(f"unknown MoE prefill tile keys {sorted(unknown)}")
    moe_schedule.check_flags(tiles)
    return tiles


@triton.jit
def _gate_up_silu_kernel(h_ptr, a_ptr, w_ptr, w_desc, pair_ptr, block_expert_ptr, scale_ptr,
                         num_pairs, num_experts, inter, k_in, a_row_div,
                         stride_a, stride_we, stride_wp, stride_wn, stride_h,
                         stride_se, stride_sp, stride_sn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         IEEE: tl.constexpr, W_SCALED: tl.constexpr, LIBDEVICE: tl.constexpr,
                         N_FIRST: tl.constexpr = 0, SPLIT_TAIL: tl.constexpr = 0,
                         TMA: tl.constexpr = 0, USE_PDL: tl.constexpr = 0):
    pdl.start(USE_PDL)  # which expert a block reads is the sort's output
    block, n_tile = moe_schedule.block_and_column_tile(N_FIRST)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    if not SPLIT_TAIL:
        _gate_up_silu_tile(h_ptr, a_ptr, w_ptr, w_desc, pair_ptr, scale_ptr, expert, n_tile,
                           num_pairs, inter, k_in, a_row_div, stride_a, stride_we, stride_wp,
                           stride_wn, stride_h, stride_se, stride_sp, stride_sn, block,
                           BLOCK_M, BLOCK_N, BLOCK_K, IEEE, W_SCALED, LIBDEVICE, TMA, USE_PDL)
    elif moe_schedule.tail_block(pair_ptr, block, num_pairs, BLOCK_M):
        # the expert's last rows fill half the block or less: half a block's GEMM
        _gate_up_silu_tile(h_ptr, a_ptr, w_ptr, w_desc, pair_ptr, scale_ptr, expert, n_tile,
                           num_pairs, inter, k_in, a_row_div, stride_a, stride_we, stride_wp,
                           stride_wn, stride_h, stride_se, stride_sp, stride_sn, 2 * block,
                           BLOCK_M // 2, BLOCK_N, BLOCK_K, IEEE, W_SCALED, LIBDEVICE, TMA,
                           USE_PDL)
    else:
        _gate_up_silu_tile(h_ptr, a_ptr, w_ptr, w_desc, pair_ptr, scale_ptr, expert, n_tile,
                           num_pairs, inter, k_in, a_row_div, stride_a, stride_we, stride_wp,
                           stride_wn, stride_h, stride_se, stride_sp, stride_sn, block,
                           BLOCK_M, BLOCK_N, BLOCK_K, IEEE, W_SCALED, LIBDEVICE, TMA, USE_PDL)


@triton.jit
def _gate_up_sums(a_ptr, w_ptr, w_desc, a_rows, valid, expert, cols, n_tile, inter, k_in,
                  stride_a, stride_we, stride_wp, stride_wn, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                  W_SCALED: tl.constexpr, TMA: tl.constexpr):
    """The gate and the up GEMM's fp32 sums [BLOCK_M, BLOCK_N], side by side."""
    w_gate = w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn
    w_up = w_gate + stride_wp
    gate_row = expert.to(tl.int32) * 2 * inter + n_tile * BLOCK_N  # of the descriptor's view
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * stride_a + ks[None, :],
                    mask=valid[:, None] & (ks[None, :] < k_in), other=0.0)
        if TMA:
            gate = tl.trans(w_desc.load([gate_row, k0]))
            up = tl.trans(w_desc.load([gate_row + inter, k0]))
        else:
            w_mask = (cols[None, :] < inter) & (ks[:, None] < k_in)
            gate = tl.load(w_gate + ks[:, None], mask=w_mask, other=0.0)
            up = tl.load(w_up + ks[:, None], mask=w_mask, other=0.0)
        if W_SCALED:  # E4M3 weights: exact in the activations' dtype, scaled after the sum
            gate = gate.to(a_ptr.dtype.element_ty)
            up = up.to(a_ptr.dtype.element_ty)
        if IEEE:  # fp32 inputs: no TF32
            acc_gate = tl.dot(a, gate, acc_gate, input_precision="ieee")
            acc_up = tl.dot(a, up, acc_up, input_precision="ieee")
        else:
            acc_gate = tl.dot(a, gate, acc_gate)
            acc_up = tl.dot(a, up, acc_up)
    return acc_gate, acc_up


@triton.jit
def _gate_up_joint_sums(a_ptr, w_desc, a_rows, valid, expert, n_tile, k_in, stride_a,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """_gate_up_sums in one GEMM of 2 BLOCK_N columns: the gate's and the up's rows of one
    column tile in one TMA load of the [E * 2, I, H] view (16-bit weights only)."""
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * stride_a + ks[None, :],
                    mask=valid[:, None] & (ks[None, :] < k_in), other=0.0)
        w = w_desc.load([expert.to(tl.int32) * 2, n_tile * BLOCK_N, k0])
        acc = tl.dot(a, tl.trans(tl.reshape(w, (2 * BLOCK_N, BLOCK_K))), acc)
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))


@triton.jit
def _gate_up_silu_tile(h_ptr, a_ptr, w_ptr, w_desc, pair_ptr, scale_ptr, expert, n_tile,
                       num_pairs, inter, k_in, a_row_div, stride_a, stride_we, stride_wp,
                       stride_wn, stride_h, stride_se, stride_sp, stride_sn, block,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       IEEE: tl.constexpr, W_SCALED: tl.constexpr, LIBDEVICE: tl.constexpr,
                       TMA: tl.constexpr, USE_PDL: tl.constexpr):
    """BLOCK_M sorted rows (the block-th run of BLOCK_M) times BLOCK_N columns of the
    expert's gate and up; TMA 1: the weights by the descriptor of their [E * 2 I, H] view,
    2: of their [E * 2, I, H] view, gate and up in one GEMM."""
    pairs, valid, a_rows = moe_routing.block_pairs(pair_ptr, block, num_pairs, a_row_div,
                                                   BLOCK_M)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if TMA == 2:
        acc_gate, acc_up = _gate_up_joint_sums(a_ptr, w_desc, a_rows, valid, expert, n_tile,
                                               k_in, stride_a, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc_gate, acc_up = _gate_up_sums(a_ptr, w_ptr, w_desc, a_rows, valid, expert, cols,
                                         n_tile, inter, k_in, stride_a, stride_we, stride_wp,
                                         stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, W_SCALED,
                                         TMA)
    if W_SCALED:
        scales = scale_ptr + expert.to(tl.int64) * stride_se + cols * stride_sn
        acc_gate = acc_gate * tl.load(scales, mask=cols < inter, other=0.0)[None, :]
        acc_up = acc_up * tl.load(scales + stride_sp, mask=cols < inter, other=0.0)[None, :]
    pdl.inputs_read(USE_PDL)
    dtype = h_ptr.dtype.element_ty
    h = silu_mul_values(acc_gate.to(dtype), acc_up.to(dtype), LIBDEVICE)
    tl.store(h_ptr + pairs.to(tl.int64)[:, None] * stride_h + cols[None, :], h.to(dtype),
             mask=valid[:, None] & (cols[None, :] < inter))


def gate_up_silu(x: torch.Tensor, gate_up: torch.Tensor, pair_of_row: torch.Tensor,
                 block_expert: torch.Tensor, num_pairs: int, top_k: int, tiles: tuple,
                 scale: torch.Tensor | None = None, schedule: dict | None = None
                 ) -> torch.Tensor:
    """[num_pairs, I]: silu(x[p // top_k] @ gate^T) * (x[p // top_k] @ up^T) of pair p's
    expert; rows of pairs held elsewhere unwritten. gate_up: [E, 2 I, H] or a narrowed
    layout's [E, 2, I, H] view; FP8 with `scale` [E, 2 I, 1] or [E, 2, I, 1]. `schedule`:
    kernels/moe_schedule.py's flags (None: all off)."""
    schedule = schedule or {}
    w = gate_up if gate_up.dim() == 4 else gate_up.unflatten(1, (2, gate_up.shape[1] // 2))
    if w.stride(3) != 1:
        w = w.contiguous()
    if scale is not None and scale.dim() == 3:
        scale = scale.unflatten(1, (2, scale.shape[1] // 2))
    inter, k_in = w.shape[2], w.shape[3]
    x = x.contiguous()
    h = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = tiles
    block_m = pair_of_row.numel() // block_expert.numel()
    grid, n_first = moe_schedule.grid(block_expert.numel(), triton.cdiv(inter, block_n),
                                      schedule.get("n_first", 0))
    joint = schedule.get("joint", 0) and x.dtype != torch.float32
    w_desc = moe_schedule.weight_descriptor(gate_up, x, block_n, block_k,
                                            schedule.get("tma", 0) or joint, 2 if joint else 1)
    _gate_up_silu_kernel[grid](
        h, x, w, w_desc, pair_of_row, block_expert, scale if scale is not None else h,
        num_pairs, w.shape[0], inter, k_in, top_k, x.stride(0), w.stride(0), w.stride(1),
        w.stride(2), h.stride(0), *((0, 0, 0) if scale is None else scale.stride()[:3]),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32,
        W_SCALED=scale is not None, LIBDEVICE=x.is_cuda, N_FIRST=n_first,
        SPLIT_TAIL=int(bool(schedule.get("split_tail", 0)) and block_m >= 32),
        TMA=0 if w_desc is None else 2 if joint else 1, num_warps=warps, num_stages=stages,
        **pdl.launch_options(x.device))
    return h


@triton.jit
def _topk_sum_kernel(out_ptr, y_ptr, ids_ptr, n, first_expert, num_local,
                     TOP_K: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = 0):
    pdl.start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        local = tl.load(ids_ptr + token * TOP_K + slot) - first_expert
        width = tl.where((local >= 0) & (local < num_local), n, 0)  # held elsewhere: none
        acc += tl.load(y_ptr + (token * TOP_K + slot) * n + cols, mask=cols < width,
                       other=0.0).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    tl.store(out_ptr + token * n + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < n)


SUM_BLOCK = 1024


def topk_sum(y: torch.Tensor, ids: torch.Tensor, first_expert: int, num_local: int,
             block: int = SUM_BLOCK, warps: int = 4) -> torch.Tensor:
    """[T, n]: the sum over each token's k pairs (y [T * k, n], pair t * k + j) held here
    (expert ids first_expert .. + num_local - 1), in slot order, in fp32."""
    tokens, top_k = ids.shape
    n = y.shape[1]
    out = torch.empty(tokens, n, dtype=y.dtype, device=y.device)
    block = min(block, triton.next_power_of_2(n))
    if tokens:
        _topk_sum_kernel[(tokens, triton.cdiv(n, block))](
            out, y.contiguous(), ids.contiguous(), n, first_expert, num_local, TOP_K=top_k,
            BLOCK=block, num_warps=warps, **pdl.launch_options(y.device))
    return out
