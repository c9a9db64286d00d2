"""A decode step's post-attention residual add + RMSNorm and the MoE router in one launch, at
one row: what kernels/rmsnorm.py's add_rms_norm and then kernels/moe_router.py's
route_from_hidden compute in two.

A program per expert: it loads its router row and the norm's weight before PDL's grid wait,
then adds the residual, normalises the row (every program the whole row: 8 KB read from L2,
so no program waits for another's norm) and stores its logit (the dot product with the
normalised row, rounded to the activations' dtype, kept in fp32); program 0 also stores the
new residual and the normalised row (the experts' input). The last program to take a ticket
(split_tickets.py) routes the row from the stored logits with moe_router's code.

Rounding: the add and the norm as kernels/rmsnorm.py rounds them, in its layout at the same
warps (the same bits); the logit is one program's fp32 sum over H, as the router kernel's,
in this kernel's layout (the sum's order may differ from the router kernel's by its layout:
logits a rounding apart at most).

Measured on an H200 (Qwen3-30B-A3B, b1 decode at 1k context, CUDA graphs, 3 rounds;
docs/benchmark_log.md): 2.6685 ms a step against 2.7280 with the two launches (1.022x), in
another call 2.6894 against 2.7551 (1.024x); one warp a program 2.6619 (the norm's sum of
squares then in another order than the norm kernel's: not taken)."""
import os

import torch
import triton
import triton.language as tl

from parashift.kernels import moe_router, moe_routing, pdl, split_tickets
from parashift.kernels.rmsnorm import num_warps as norm_warps
from parashift.kernels.rmsnorm import vector_width

ENV = "PARASHIFT_MOE_NORM_ROUTER"
MODES = ("0", "1")


def enabled() -> bool:
    """PARASHIFT_MOE_NORM_ROUTER: 1 (the default) the MoE layers' post-attention norm and
    router in one launch at one row, 0 in two. Read at each call (a graph keeps its
    capture's)."""
    value = os.environ.get(ENV, "1")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {list(MODES)}")
    return value == "1"


@triton.jit
def _norm_router_kernel(out_ptr, new_x_ptr, x_ptr, residual_ptr, norm_w_ptr, eps, w_ptr,
                        logits_ptr, weights_ptr, ids_ptr, counter_ptr, num_experts, stride_we,
                        N: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr,
                        EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
                        RENORMALIZE: tl.constexpr, USE_PDL: tl.constexpr):
    expert = tl.program_id(0)
    cols = tl.max_contiguous(tl.arange(0, BLOCK), VEC)
    mask = cols < N
    # neither weight is an earlier kernel's output: loaded during the kernel before
    router_row = tl.load(w_ptr + expert.to(tl.int64) * stride_we + cols, mask=mask, other=0.0)
    g = tl.load(norm_w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl.start(USE_PDL)
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    r = tl.load(residual_ptr + cols, mask=mask, other=0.0)
    x = (x.to(tl.float32) + r.to(tl.float32)).to(new_x_ptr.dtype.element_ty)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) * (1.0 / N) + eps)  # as kernels/rmsnorm.py
    out = (g * (xf * rstd).to(x.dtype).to(tl.float32)).to(out_ptr.dtype.element_ty)
    logit = tl.sum(out.to(tl.float32) * router_row.to(tl.float32), 0)
    pdl.inputs_read(USE_PDL)
    if expert == 0:
        tl.store(new_x_ptr + cols, x, mask=mask)
        tl.store(out_ptr + cols, out, mask=mask)
    tl.store(logits_ptr + expert, logit.to(out_ptr.dtype.element_ty).to(tl.float32))
    if split_tickets.is_last_of(counter_ptr, num_experts):
        split_tickets.reset(counter_ptr)
        moe_router.route_stored(logits_ptr, weights_ptr, ids_ptr, 1, num_experts, TOP_K,
                                EXPERTS, RENORMALIZE)


def fits(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
         router: torch.Tensor, top_k: int) -> bool:
    """Whether norm_router takes these: one row of 16-bit or fp32 activations, the residual,
    norm weight and router in their dtype, contiguous, experts and k the routing fits,
    counters at hand."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.shape == residual.shape
            and x.dtype == residual.dtype == norm_weight.dtype == router.dtype
            and x.stride(1) == 1 and residual.stride(1) == 1 and norm_weight.is_contiguous()
            and router.stride(1) == 1 and router.shape[1] == x.shape[1]
            and moe_routing.route_fits(router.shape[0], top_k)
            and split_tickets.counters(x.device, 1) is not None)


def norm_router(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                eps: float, router: torch.Tensor, top_k: int, renormalize: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual, routing weights [1, k] in x's dtype, expert ids
    [1, k] int64) of one row, the routing that of moe_routing.route on the normed row's
    logits (rounded to x's dtype); `fits` says where it applies."""
    if not fits(x, residual, norm_weight, router, top_k):
        raise ValueError(f"norm_router takes one contiguous row, got x {tuple(x.shape)}, "
                         f"router {tuple(router.shape)}, k {top_k}")
    num_experts, hidden = router.shape
    out, new_x = torch.empty_like(x), torch.empty_like(x)
    logits = torch.empty(1, num_experts, dtype=torch.float32, device=x.device)
    weights = torch.empty(1, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(1, top_k, dtype=torch.int64, device=x.device)
    block = triton.next_power_of_2(hidden)
    _norm_router_kernel[(num_experts,)](
        out, new_x, x, residual, norm_weight, eps, router, logits, weights, ids,
        split_tickets.counters(x.device, 1), num_experts, router.stride(0), N=hidden,
        BLOCK=block, VEC=vector_width(x, norm_weight, out),
        EXPERTS=triton.next_power_of_2(num_experts), TOP_K=top_k, RENORMALIZE=renormalize,
        num_warps=norm_warps(block), enable_fp_fusion=False, **pdl.launch_options(x.device))
    return out, new_x, weights, ids
