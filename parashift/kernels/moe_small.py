"""A decode step's experts at a few token-expert pairs (one or two tokens at top-8): two GEMV
kernels that read each pair's expert straight from the routing ids, where the grouped GEMM
(kernels/fused_moe.py) sorts the pairs, pads each expert's run to 16-row tensor-core tiles
and fills few programs.

`_gate_up_kernel`, a program per (pair, BLOCK_N columns of the intermediate dim): the
expert's gate and up rows over all of K, SiLU-and-mul in the epilogue; it writes the pair's
activation. `_down_kernel`, a program per (token, BLOCK_N output columns): the down rows of
all k experts of the token as one [k, BLOCK_N, BLOCK_K] tile a step (many bytes in flight
even at one token), each pair's output rounded and weighted as the grouped path rounds it,
and the k pairs summed in the program (no atomics, no sum kernel). The column tile is the
slow axis of both grids, so pairs of one expert read its rows at about the same time and all
but the first find them in L2. Weights are read as stored: bf16/fp16/fp32, or E4M3 widened
in registers with the scale of each output row applied after the sum. A thread reads 16 bytes
of consecutive K at once and keeps their sum in its registers (as kernels/fp8_gemv.py), so
the loop has no cross-thread reduction.

Rounding follows fused_experts: gate and up rounded to the activations' dtype, SiLU and its
product rounded as kernels/silu_mul.py, each pair's down output rounded, times its weight,
rounded again, the k of a token summed in fp32. Deterministic mode never comes here (its
experts run the batch-invariant GEMMs, layers/fused_moe.py)."""
import os

import torch
import triton
import triton.language as tl

from parashift.kernels import num_sms, pdl
from parashift.kernels.silu_mul import silu_mul_values

VEC_BYTES = 16  # of weights a thread loads at once and sums in registers; BLOCK_K a multiple


def _max_pairs_from_env() -> tuple[int, int]:
    """PARASHIFT_MOE_SMALL: 0 keeps every batch on the grouped GEMM, 1 (default) takes this
    path up to DEFAULT_MAX_PAIRS token-expert pairs (DEFAULT_MAX_PAIRS_FP8 for FP8 experts),
    a larger integer up to that many for both; (16-bit experts' limit, FP8 experts')."""
    value = os.environ.get("PARASHIFT_MOE_SMALL", "1")
    if not value.isdigit():
        raise ValueError(f"PARASHIFT_MOE_SMALL must be 0, 1 or a number of pairs, got {value!r}")
    if int(value) == 1:
        return DEFAULT_MAX_PAIRS, DEFAULT_MAX_PAIRS_FP8
    return int(value), int(value)


# Measured on an H200 (session 41, benchmarks/moe_small.py, Qwen3-30B-A3B's experts): 16-bit
# experts beat the grouped GEMM at one and two tokens and lose from 8 (143 against 140 us);
# FP8 experts win up to 16 tokens (88 against 134 us at 8, 144 against 182 at 16).
DEFAULT_MAX_PAIRS = 16  # two tokens at top-8
DEFAULT_MAX_PAIRS_FP8 = 128  # sixteen tokens at top-8
MAX_PAIRS, MAX_PAIRS_FP8 = _max_pairs_from_env()


def takes(num_pairs: int, fp8: bool = False) -> bool:
    return 0 < num_pairs <= (MAX_PAIRS_FP8 if fp8 else MAX_PAIRS)


@triton.jit
def _vec_sums(w, x, VEC: tl.constexpr):
    """w [N, K] * x [1, K] in fp32, each VEC consecutive K summed: [N, K / VEC]."""
    prod = w.to(tl.float32) * x.to(tl.float32)
    return tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // VEC, VEC)), axis=2)


@triton.jit
def _vec_sums_3d(w, x, VEC: tl.constexpr):
    """_vec_sums of w [S, N, K] and x [S, 1, K]: [S, N, K / VEC]."""
    prod = w.to(tl.float32) * x.to(tl.float32)
    return tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1], prod.shape[2] // VEC, VEC)),
                  axis=3)


@triton.jit
def _gate_up_kernel(h_ptr, x_ptr, ids_ptr, w_ptr, s_ptr, num_local, first_expert, top_k,
                    inter, k_in, stride_x, stride_h, stride_we, stride_wp, stride_wn,
                    stride_se, stride_sp, stride_sn, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, VEC: tl.constexpr, W_SCALED: tl.constexpr,
                    EVEN_K: tl.constexpr, LIBDEVICE: tl.constexpr, USE_PDL: tl.constexpr):
    pdl.start(USE_PDL)  # which expert a pair reads is the routing's output
    pair = tl.program_id(0)
    expert = tl.load(ids_ptr + pair).to(tl.int32) - first_expert
    if (expert < 0) | (expert >= num_local):
        return  # held elsewhere (EP): its row is never read
    token = pair // top_k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < inter
    rows = cols % inter  # columns past the end read a real row (no row mask); not stored
    gate_rows = (w_ptr + expert.to(tl.int64) * stride_we
                 + rows[:, None].to(tl.int64) * stride_wn)
    up_rows = gate_rows + stride_wp
    x_row = x_ptr + token.to(tl.int64) * stride_x
    offs_k = tl.max_contiguous(tl.arange(0, BLOCK_K), VEC)
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        k = (k0 + offs_k)[None, :]
        if EVEN_K:
            x = tl.load(x_row + k)  # [1, BLOCK_K]: in the weight tile's layout
            gate = tl.load(gate_rows + k)
            up = tl.load(up_rows + k)
        else:
            x = tl.load(x_row + k, mask=k < k_in, other=0.0)
            gate = tl.load(gate_rows + k, mask=k < k_in, other=0.0)
            up = tl.load(up_rows + k, mask=k < k_in, other=0.0)
        acc_gate += _vec_sums(gate, x, VEC)
        acc_up += _vec_sums(up, x, VEC)
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    if W_SCALED:
        scale = s_ptr + expert.to(tl.int64) * stride_se + rows.to(tl.int64) * stride_sn
        gate = gate * tl.load(scale)
        up = up * tl.load(scale + stride_sp)
    pdl.inputs_read(USE_PDL)
    dtype = h_ptr.dtype.element_ty
    out = silu_mul_values(gate.to(dtype), up.to(dtype), LIBDEVICE)
    tl.store(h_ptr + pair.to(tl.int64) * stride_h + cols, out.to(dtype), mask=n_ok)


@triton.jit
def _down_kernel(out_ptr, h_ptr, ids_ptr, weights_ptr, w_ptr, s_ptr, num_local, first_expert,
                 top_k, n_out, k_in, stride_h, stride_out, stride_we, stride_wn, stride_se,
                 stride_sn, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 VEC: tl.constexpr, W_SCALED: tl.constexpr, EVEN_K: tl.constexpr,
                 USE_PDL: tl.constexpr):
    pdl.start(USE_PDL)
    token = tl.program_id(0)
    slots = tl.arange(0, TOP_K)
    pairs = token * top_k + slots
    expert = tl.load(ids_ptr + pairs, mask=slots < top_k, other=0).to(tl.int32) - first_expert
    held = (slots < top_k) & (expert >= 0) & (expert < num_local)
    expert = tl.where(held, expert, 0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < n_out
    rows = cols % n_out
    w_rows = (w_ptr + expert[:, None, None].to(tl.int64) * stride_we
              + rows[None, :, None].to(tl.int64) * stride_wn)  # [TOP_K, BLOCK_N, 1]
    h_rows = h_ptr + pairs[:, None, None].to(tl.int64) * stride_h  # [TOP_K, 1, 1]
    offs_k = tl.max_contiguous(tl.arange(0, BLOCK_K), VEC)
    acc = tl.zeros((TOP_K, BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        k = (k0 + offs_k)[None, None, :]
        mask = held[:, None, None]
        if not EVEN_K:
            mask = mask & (k < k_in)
        h = tl.load(h_rows + k, mask=mask, other=0.0)
        w = tl.load(w_rows + k, mask=mask, other=0.0)
        acc += _vec_sums_3d(w, h, VEC)
    y = tl.sum(acc, axis=2)  # [TOP_K, BLOCK_N]
    if W_SCALED:
        y = y * tl.load(s_ptr + expert[:, None].to(tl.int64) * stride_se
                        + rows[None, :].to(tl.int64) * stride_sn)
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + pairs, mask=held, other=0.0).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    y = (y.to(dtype).to(tl.float32) * weight[:, None]).to(dtype).to(tl.float32)
    total = tl.sum(tl.where(held[:, None], y, 0.0), axis=0)
    tl.store(out_ptr + token.to(tl.int64) * stride_out + cols, total.to(dtype), mask=n_ok)


def small_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                  scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                  tiles: tuple[tuple, tuple] | None = None) -> torch.Tensor:
    """fused_experts' result [T, H] in two launches. gate_up [E, 2 I, H] or its narrowed
    [E, 2, I / f, H] view, down [E, H, I]; FP8 experts with `scales` (gate_up's, down's)
    per output row. tiles: ((BLOCK_N, BLOCK_K, warps) of gate_up, of down), else chosen."""
    gate_up_scale, down_scale = scales or (None, None)
    if gate_up.dim() == 3:
        gate_up = gate_up.unflatten(1, (2, gate_up.shape[1] // 2))
        gate_up_scale = None if gate_up_scale is None else gate_up_scale.unflatten(
            1, (2, gate_up_scale.shape[1] // 2))
    gate_up, down = (w if w.stride(-1) == 1 else w.contiguous() for w in (gate_up, down))
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids, weights = ids.contiguous(), weights.contiguous()
    tokens, top_k = ids.shape
    num_local, inter, hidden = gate_up.shape[0], gate_up.shape[2], gate_up.shape[3]
    h = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    up_tiles, down_tiles = tiles or choose_tiles(tokens, top_k, inter, hidden,
                                                 gate_up.element_size(), x.device)
    vec = VEC_BYTES // gate_up.element_size()
    if up_tiles[1] % vec or down_tiles[1] % vec:
        raise ValueError(f"the K steps of {up_tiles}, {down_tiles} must be multiples of {vec}")
    block_n, block_k, warps = up_tiles
    w_scaled = gate_up_scale is not None
    _gate_up_kernel[(tokens * top_k, triton.cdiv(inter, block_n))](
        h, x, ids, gate_up, gate_up_scale if w_scaled else h, num_local, first_expert, top_k,
        inter, hidden, x.stride(0), h.stride(0), *gate_up.stride()[:3],
        *(gate_up_scale.stride()[:3] if w_scaled else (0, 0, 0)), BLOCK_N=block_n,
        BLOCK_K=block_k, VEC=vec, W_SCALED=w_scaled, EVEN_K=hidden % block_k == 0,
        LIBDEVICE=x.is_cuda, num_warps=warps, enable_fp_fusion=False,
        **pdl.launch_options(x.device))
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = down_tiles
    _down_kernel[(tokens, triton.cdiv(hidden, block_n))](
        out, h, ids, weights, down, down_scale if w_scaled else out, num_local, first_expert,
        top_k, hidden, inter, h.stride(0), out.stride(0), down.stride(0), down.stride(1),
        *((down_scale.stride(0), down_scale.stride(1)) if w_scaled else (0, 0)),
        TOP_K=triton.next_power_of_2(top_k), BLOCK_N=block_n, BLOCK_K=block_k, VEC=vec,
        W_SCALED=w_scaled, EVEN_K=inter % block_k == 0, num_warps=warps,
        **pdl.launch_options(x.device))
    return out


def choose_tiles(tokens: int, top_k: int, inter: int, hidden: int, weight_bytes: int,
                 device: torch.device) -> tuple[tuple, tuple]:
    """((BLOCK_N, BLOCK_K, warps) of gate_up, of down), or PARASHIFT_MOE_SMALL_TILES's: the
    widest column tile (8 to 32) that still gives two programs per SM, and a K step that
    gives each thread 64 bytes of weights a tile (bf16 tiles of twice that took 128-168
    registers on sm_90, ptxas; these 64-96 and no spills)."""
    if TILES is not None:
        return TILES
    sms = num_sms(device)

    def block_n(programs_per_tile: int, n: int) -> int:
        width = 32
        while width > 8 and programs_per_tile * triton.cdiv(n, width) < 2 * sms:
            width //= 2
        return min(width, max(8, triton.next_power_of_2(n)))

    def block_k(k: int, elements: int) -> int:
        return max(2 * VEC_BYTES, min(elements, triton.next_power_of_2(k)))

    per_thread = 64 // weight_bytes
    up_n = block_n(tokens * top_k, inter)
    down_n = block_n(tokens, hidden)
    slots = triton.next_power_of_2(top_k)  # the down tile holds the rows of k experts
    return ((up_n, block_k(hidden, per_thread * 128 // up_n), 4),
            (down_n, block_k(inter, per_thread * 256 // (slots * down_n)), 8))


def _tiles_from_env() -> tuple[tuple, tuple] | None:
    """PARASHIFT_MOE_SMALL_TILES="n,k,warps,n,k,warps" (gate_up's, then down's; powers of
    two) for measurements (benchmarks/moe_small.py prints the fastest)."""
    value = os.environ.get("PARASHIFT_MOE_SMALL_TILES")
    if not value:
        return None
    parts = value.split(",")
    if len(parts) != 6 or not all(p.isdigit() and int(p) & (int(p) - 1) == 0 and int(p) > 0
                                  for p in parts):
        raise ValueError("PARASHIFT_MOE_SMALL_TILES must be six powers of two "
                         f"\"n,k,warps,n,k,warps\", got {value!r}")
    numbers = tuple(int(p) for p in parts)
    return numbers[:3], numbers[3:]


TILES = _tiles_from_env()
