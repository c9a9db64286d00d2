"""A decode step's MoE router in one launch: the gate's GEMV (x [1-4 rows, H] times the
router weight [E, H]) and the routing of moe_routing.route (fp32 softmax, top k, renormalized
when asked) of its logits.

Through cuBLAS and the routing kernel this was two launches of ~5 and ~2 us for 0.5 MB of
weight (Qwen3-30B-A3B: 128 experts x 2048, batch 1; benchmarks/results/raw/s43_profiles).
Here each program owns BLOCK_E experts over all of H (one program's sums: the same bits run
to run), rounds their logits to the activations' dtype (the logits the unfused path routes
on), stores them in fp32 and takes a ticket (split_tickets.py); the last program to take one
routes every row from the stored logits, as moe_routing's kernel does.

Measured on an H200 (benchmarks/moe_router.py, Qwen3-30B-A3B's router, CUDA graphs, PDL
off): one row 5.1 us against 7.4 for cuBLAS then the routing kernel, 4.8 where the skinny
GEMM's choice (timed with L2 flushed: it took cuBLAS in one call, a GEMV in the next) takes a
GEMV; two rows 7.4 against 5.1, four 12.9 against 7.3 (one program routes the rows one after
the other), so the layer takes it at one row, where it does not hang on that choice."""
import os

import torch
import triton
import triton.language as tl

from parashift.engine_switches import FUSED_ROUTER
from parashift.kernels import moe_routing, pdl, split_tickets

MAX_ROWS = 4  # the kernel's
LAYER_ROWS = 1  # what `fits` takes
# PARASHIFT_FUSED_ROUTER=0 keeps the gate GEMM and the routing kernel apart (before/after)
ENABLED = FUSED_ROUTER
# 128 programs of 4 KB each at Qwen3-30B-A3B's shape, one warp each (the last program's
# routing is eight dependent reductions over the experts: shuffles only in one warp). On an
# H200 (session 45, benchmarks/moe_router.py, one row): 4.77 us against 5.13 with 2 warps and
# 5.21 with 4; the engine's b1 step 2.7402 against 2.7579 ms with 2 (docs/benchmark_log.md)
BLOCK_E, NUM_WARPS = 1, 1
# PARASHIFT_MOE_ROUTER_WARPS: the warps of a program (read at each call, for an A/B)
WARPS_ENV = "PARASHIFT_MOE_ROUTER_WARPS"


def default_warps() -> int:
    value = os.environ.get(WARPS_ENV, str(NUM_WARPS))
    if value not in ("1", "2", "4", "8"):
        raise ValueError(f"{WARPS_ENV} must be 1, 2, 4 or 8, got {value!r}")
    return int(value)


@triton.jit
def _router_kernel(x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, counter_ptr, rows,
                   num_experts, K, stride_xm, stride_we, ROWS: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, EXPERTS: tl.constexpr,
                   PROGRAMS: tl.constexpr, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                   USE_PDL: tl.constexpr):
    offs_e, w_rows, w = first_tile(tl.program_id(0), w_ptr, num_experts, K, stride_we, BLOCK_E,
                                   BLOCK_K)
    pdl.start(USE_PDL)  # the weight is no earlier kernel's output: its first tile loaded
    store_logits(w, w_rows, offs_e, x_ptr, logits_ptr, rows, num_experts, K, stride_xm, ROWS,
                 BLOCK_E, BLOCK_K, USE_PDL)
    if split_tickets.is_last(counter_ptr, PROGRAMS):
        split_tickets.reset(counter_ptr)
        route_stored(logits_ptr, weights_ptr, ids_ptr, rows, num_experts, TOP_K, EXPERTS,
                     RENORMALIZE)


@triton.jit
def first_tile(e_block, w_ptr, num_experts, K, stride_we, BLOCK_E: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """(the block's experts, their weight rows, the rows' first BLOCK_K columns)."""
    offs_e = e_block * BLOCK_E + tl.arange(0, BLOCK_E)
    # experts past E read expert E-1 (in bounds, no mask on the weight's loads); not stored
    w_rows = w_ptr + (offs_e % num_experts)[:, None].to(tl.int64) * stride_we
    offs_k = tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
    return offs_e, w_rows, w


@triton.jit
def store_logits(w, w_rows, offs_e, x_ptr, logits_ptr, rows, num_experts, K, stride_xm,
                 ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_PDL: tl.constexpr):
    """The block's logits of every row (w: first_tile's), rounded to x's dtype, stored in
    fp32."""
    e_ok = offs_e < num_experts
    offs_m = tl.arange(0, ROWS)
    m_ok = offs_m < rows
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((ROWS, BLOCK_E), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        if k0 > 0:
            w = tl.load(w_rows + k[None, :], mask=k[None, :] < K, other=0.0)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    pdl.inputs_read(USE_PDL)
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(logits_ptr + offs_m[:, None] * num_experts + offs_e[None, :], logits,
             mask=m_ok[:, None] & e_ok[None, :])


@triton.jit
def route_stored(logits_ptr, weights_ptr, ids_ptr, rows, num_experts, TOP_K: tl.constexpr,
                 EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr):
    """Every row routed from the logits other programs stored (read from L2)."""
    experts = tl.arange(0, EXPERTS)
    held = experts < num_experts
    for row in range(rows):
        row_logits = tl.load(logits_ptr + row * num_experts + experts, mask=held,
                             other=-float("inf"), cache_modifier=".cg")
        moe_routing.route_row(row_logits, held, weights_ptr + row * TOP_K,
                              ids_ptr + row * TOP_K, TOP_K, EXPERTS, RENORMALIZE)


def fits(x: torch.Tensor, weight: torch.Tensor, top_k: int) -> bool:
    """Whether the layer routes these through route_from_hidden: LAYER_ROWS rows of 16-bit
    or fp32 activations, the weight in their dtype, experts and k the routing kernel fits,
    counters at hand."""
    return (ENABLED and x.dim() == 2 and 1 <= x.shape[0] <= LAYER_ROWS
            and x.dtype == weight.dtype and weight.stride(1) == 1
            and moe_routing.route_fits(weight.shape[0], top_k)
            and split_tickets.counters(x.device, 1) is not None)


def route_from_hidden(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
                      block_e: int = BLOCK_E, num_warps: int | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_routing.route(x @ weight.T rounded to x's dtype, top_k, renormalize) in one
    launch: (weights [T, k] in x's dtype, expert ids [T, k] int64); x [T <= 4, H]."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.shape[1] != weight.shape[1]:
        raise ValueError(f"route_from_hidden takes x [1..{MAX_ROWS}, {weight.shape[1]}], "
                         f"got {tuple(x.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    num_warps = num_warps or default_warps()
    (rows, hidden), num_experts = x.shape, weight.shape[0]
    programs = triton.cdiv(num_experts, block_e)
    logits = torch.empty(rows, num_experts, dtype=torch.float32, device=x.device)
    weights = torch.empty(rows, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(rows, top_k, dtype=torch.int64, device=x.device)
    _router_kernel[(programs,)](
        x, weight, logits, weights, ids, split_tickets.counters(x.device, 1), rows,
        num_experts, hidden, x.stride(0), weight.stride(0),
        ROWS=triton.next_power_of_2(rows), BLOCK_E=block_e,
        BLOCK_K=min(triton.next_power_of_2(hidden), 4096 // block_e),
        EXPERTS=triton.next_power_of_2(num_experts), PROGRAMS=programs, TOP_K=top_k,
        RENORMALIZE=renormalize, num_warps=num_warps, **pdl.launch_options(x.device))
    return weights, ids
