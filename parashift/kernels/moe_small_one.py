"""kernels/moe_small.py's two kernels in one launch: a program per gate_up tile and a program
per down tile, each taking its work by ticket (gate_up's tiles first). A down tile loads its
first weight tile, then waits for the count of finished gate_up tiles to reach them all and
reads the activations from L2: its weights stream in during gate_up's tail, where the
two-launch path's down kernel starts only once gate_up has completed (PDL's grid wait).

Deadlock-free at any residency: a down tile waits only for gate_up tiles whose tickets were
taken before its own, by programs that wait on nothing. The counters (three: tickets,
gate_up tiles done, programs left) are set back to 0 by the launch's last program; under PDL
the ticket is taken before the grid wait, so consecutive launches alternate between two
counter sets (the launch before may still be running; the one before it has completed).

The same tiles' code as the two-launch path (moe_small._gate_up_tile, _down_tile): the same
bits. With the router too (`routed_experts`): a program per expert's logit takes the first
tickets, the last of them routes (moe_router's code), the experts' tiles wait for that.
PARASHIFT_MOE_SMALL_ONE=experts takes one launch for the small path's experts, =router for
the router and experts (layers/fused_moe.py, at one or two rows), 0 (the default) keeps the
router's launch and the experts' two; PARASHIFT_MOE_SMALL_ONE_TILES="n,k,n,k,warps" (gate_up's tile, down's,
the warps of both) for benchmarks/moe_chain.py's sweep."""
import os

import torch
import triton
import triton.language as tl

from parashift.kernels import moe_router, moe_routing, moe_small, pdl, split_tickets
from parashift.kernels.moe_small import (COUNT_WAIT, VEC_BYTES, _down_tile, _gate_up_tile,
                                         _pairs_of, choose_tiles)

ENV, TILES_ENV = "PARASHIFT_MOE_SMALL_ONE", "PARASHIFT_MOE_SMALL_ONE_TILES"
SLEEP_ENV = "PARASHIFT_MOE_SMALL_ONE_SLEEP_NS"  # a waiting program's pause between reads
NUM_COUNTERS = 5  # tickets, gate_up tiles done, router tiles done, routed, programs left
_COUNTERS = tl.constexpr(NUM_COUNTERS)  # as the kernel sees it
# ROUTE: 0 ids given; the router's logits in the launch, routed by the last of its programs
# (ROUTE_LAST) or by each experts' tile from the logits (ROUTE_EACH)
ROUTE_LAST, ROUTE_EACH = tl.constexpr(1), tl.constexpr(2)
POOL = "moe_small_one"
_launches = [0]  # which counter set the next launch takes


MODES = ("0", "experts", "router", "router-each")
ROUTE_OF_MODE = {"router": 1, "router-each": 2}


def mode() -> str:
    """PARASHIFT_MOE_SMALL_ONE (read at each call: a graph keeps what its capture read)."""
    value = os.environ.get(ENV, "0")
    if value not in MODES:
        raise ValueError(f"{ENV} must be one of {MODES}, got {value!r}")
    return value


def enabled() -> bool:
    """Whether the small path's experts take one launch (with or without the router)."""
    return mode() != "0"


@triton.jit
def _one_launch_kernel(out_ptr, h_ptr, x_ptr, ids_ptr, weights_ptr, up_ptr, up_s_ptr, down_ptr,
                       down_s_ptr, counters_ptr, router_ptr, logits_ptr, num_experts,
                       router_tiles, num_local, first_expert, tokens, top_k, inter, hidden,
                       up_tiles, num_programs, stride_x, stride_h, stride_out, stride_re,
                       stride_ue, stride_up, stride_un, stride_use, stride_usp, stride_usn,
                       stride_de, stride_dn, stride_dse, stride_dsn, TOP_K: tl.constexpr,
                       UP_N: tl.constexpr, UP_K: tl.constexpr, DOWN_N: tl.constexpr,
                       DOWN_K: tl.constexpr, VEC: tl.constexpr, W_SCALED: tl.constexpr,
                       EVEN_UP_K: tl.constexpr, EVEN_DOWN_K: tl.constexpr,
                       ROUTE: tl.constexpr, ROWS: tl.constexpr, ROUTER_K: tl.constexpr,
                       EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr,
                       SLEEP_NS: tl.constexpr, LIBDEVICE: tl.constexpr,
                       USE_PDL: tl.constexpr):
    # before the grid wait: the counter set is this kernel's own, set back by a launch that
    # has completed
    item = split_tickets.take_work(counters_ptr)
    logits_done_ptr = counters_ptr + 2
    routed_ptr = counters_ptr + 3
    if ROUTE != 0:
        if item < router_tiles:  # an expert's logit
            offs_e, w_rows, w = moe_router.first_tile(item, router_ptr, num_experts, hidden,
                                                      stride_re, 1, ROUTER_K)
            pdl.start(USE_PDL)  # the router's weight is no earlier kernel's output
            moe_router.store_logits(w, w_rows, offs_e, x_ptr, logits_ptr, tokens, num_experts,
                                    hidden, stride_x, ROWS, 1, ROUTER_K, USE_PDL)
            if ROUTE == ROUTE_LAST:
                if split_tickets.is_last_of(logits_done_ptr, router_tiles):
                    moe_router.route_stored(logits_ptr, weights_ptr, ids_ptr, tokens,
                                            num_experts, TOP_K, EXPERTS, RENORMALIZE)
                    split_tickets.count_done(routed_ptr)
            else:
                split_tickets.count_done(logits_done_ptr)
        else:
            pdl.start(USE_PDL)
            if ROUTE == ROUTE_LAST:
                split_tickets.wait_count(routed_ptr, 1, SLEEP_NS)
            else:
                split_tickets.wait_count(logits_done_ptr, router_tiles, SLEEP_NS)
            _experts_tile(item - router_tiles, out_ptr, h_ptr, x_ptr, ids_ptr, weights_ptr,
                          logits_ptr, num_experts, up_ptr, up_s_ptr, down_ptr, down_s_ptr,
                          counters_ptr + 1, num_local, first_expert, tokens, top_k, inter,
                          hidden, up_tiles, stride_x, stride_h, stride_out, stride_ue,
                          stride_up, stride_un, stride_use, stride_usp, stride_usn, stride_de,
                          stride_dn, stride_dse, stride_dsn, TOP_K, UP_N, UP_K, DOWN_N, DOWN_K,
                          VEC, W_SCALED, EVEN_UP_K, EVEN_DOWN_K, ROUTE == ROUTE_EACH, EXPERTS,
                          RENORMALIZE, LIBDEVICE, USE_PDL, SLEEP_NS)
    else:
        pdl.start(USE_PDL)
        _experts_tile(item, out_ptr, h_ptr, x_ptr, ids_ptr, weights_ptr, logits_ptr,
                      num_experts, up_ptr, up_s_ptr, down_ptr, down_s_ptr, counters_ptr + 1,
                      num_local, first_expert, tokens, top_k, inter, hidden, up_tiles,
                      stride_x, stride_h, stride_out, stride_ue, stride_up, stride_un,
                      stride_use, stride_usp, stride_usn, stride_de, stride_dn, stride_dse,
                      stride_dsn, TOP_K, UP_N, UP_K, DOWN_N, DOWN_K, VEC, W_SCALED, EVEN_UP_K,
                      EVEN_DOWN_K, False, EXPERTS, RENORMALIZE, LIBDEVICE, USE_PDL, SLEEP_NS)
    split_tickets.leave(counters_ptr, num_programs, _COUNTERS)


@triton.jit
def _experts_tile(item, out_ptr, h_ptr, x_ptr, ids_ptr, weights_ptr, logits_ptr, num_experts,
                  up_ptr, up_s_ptr, down_ptr, down_s_ptr, done_ptr, num_local, first_expert,
                  tokens, top_k, inter, hidden, up_tiles, stride_x, stride_h, stride_out,
                  stride_ue, stride_up, stride_un, stride_use, stride_usp, stride_usn,
                  stride_de, stride_dn, stride_dse, stride_dsn, TOP_K: tl.constexpr,
                  UP_N: tl.constexpr, UP_K: tl.constexpr, DOWN_N: tl.constexpr,
                  DOWN_K: tl.constexpr, VEC: tl.constexpr, W_SCALED: tl.constexpr,
                  EVEN_UP_K: tl.constexpr, EVEN_DOWN_K: tl.constexpr, ROUTE_HERE: tl.constexpr,
                  EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr, LIBDEVICE: tl.constexpr,
                  USE_PDL: tl.constexpr, SLEEP_NS: tl.constexpr):
    """The experts' item-th tile: gate_up's first (the column tile the slow axis: pairs of
    one expert read it together), then down's, which wait for gate_up's count. ROUTE_HERE:
    the tile routes its token from the stored logits itself, else reads ids and weights."""
    pairs = tokens * top_k
    if item < up_tiles:
        pair = item % pairs
        if ROUTE_HERE:
            expert_ids, _ = _routed_row(pair // top_k, logits_ptr, num_experts, out_ptr, TOP_K,
                                        EXPERTS, RENORMALIZE)
            expert_id = tl.sum(tl.where(tl.arange(0, TOP_K) == pair % top_k, expert_ids, 0))
        else:
            expert_id = tl.load(ids_ptr + pair)
        _gate_up_tile(pair, item // pairs, expert_id, h_ptr, x_ptr, up_ptr, up_s_ptr,
                      num_local, first_expert, top_k, inter, hidden, stride_x, stride_h,
                      stride_ue, stride_up, stride_un, stride_use, stride_usp, stride_usn, UP_N,
                      UP_K, VEC, W_SCALED, EVEN_UP_K, LIBDEVICE, USE_PDL)
        split_tickets.count_done(done_ptr)
    else:
        tile = item - up_tiles
        token = tile % tokens
        if ROUTE_HERE:
            expert_ids, pair_weights = _routed_row(token, logits_ptr, num_experts, out_ptr,
                                                   TOP_K, EXPERTS, RENORMALIZE)
        else:
            expert_ids, pair_weights = _pairs_of(token, ids_ptr, weights_ptr, top_k, TOP_K)
        _down_tile(token, tile // tokens, expert_ids, pair_weights, out_ptr, h_ptr, down_ptr,
                   down_s_ptr, num_local, first_expert, top_k, hidden, inter, stride_h,
                   stride_out, stride_de, stride_dn, stride_dse, stride_dsn, done_ptr, up_tiles,
                   TOP_K, DOWN_N, DOWN_K, VEC, W_SCALED, EVEN_DOWN_K, COUNT_WAIT, USE_PDL,
                   SLEEP_NS)


@triton.jit
def _routed_row(token, logits_ptr, num_experts, dtype_ptr, TOP_K: tl.constexpr,
                EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr):
    """The token's (expert ids, weights rounded to dtype_ptr's dtype, in fp32) [TOP_K] from
    its stored logits (read from L2), as moe_routing.route_row computes and stores them."""
    experts = tl.arange(0, EXPERTS)
    held = experts < num_experts
    logits = tl.load(logits_ptr + token * num_experts + experts, mask=held,
                     other=-float("inf"), cache_modifier=".cg")
    chosen, chosen_ids = moe_routing.route_values(logits, held, TOP_K, EXPERTS, RENORMALIZE)
    return chosen_ids, chosen.to(dtype_ptr.dtype.element_ty).to(tl.float32)


def counters(device: torch.device) -> torch.Tensor | None:
    """The next launch's counter set (alternating), or None where none can be made now (a
    first call inside a graph capture)."""
    pool = split_tickets.counters(device, 2 * NUM_COUNTERS, POOL)
    if pool is None:
        return None
    _launches[0] ^= 1
    return pool[_launches[0] * NUM_COUNTERS:]


def small_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                  scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                  tiles: tuple[tuple, tuple] | None = None, one_launch: bool | None = None
                  ) -> torch.Tensor:
    """moe_small.small_experts' result, in one launch where one_launch (None: this file's
    switch) and no two-launch tiles are given and the counters are at hand, else in two."""
    if tiles is None and (enabled() if one_launch is None else one_launch):
        up, up_scale = moe_small.paired(gate_up, scales[0] if scales else None)
        out = experts(x, weights.contiguous(), ids.contiguous(), up, down, first_expert,
                      (up_scale, scales[1]) if scales else None)
        if out is not None:
            return out
    return moe_small.small_experts(x, weights, ids, gate_up, down, first_expert, scales, tiles)


def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
            down: torch.Tensor, first_expert: int, scales: tuple | None,
            tiles: tuple | None = None) -> torch.Tensor | None:
    """moe_small.small_experts' result in one launch (gate_up as [E, 2, I, H], scales
    likewise, all contiguous in their last dim), or None where the counters are not at hand.
    tiles: (gate_up's BLOCK_N, BLOCK_K, down's BLOCK_N, BLOCK_K, warps), else chosen."""
    return _launch(x, weights, ids, None, None, gate_up, down, first_expert, scales, tiles, 0)


def routes(x: torch.Tensor, router: torch.Tensor, top_k: int, fp8: bool = False) -> bool:
    """Whether `routed_experts` takes these: MAX_ROUTED_ROWS rows routed by a router weight
    [E, H] in x's dtype that the routing kernel fits, onto the small path's experts."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROUTED_ROWS and x.dtype == router.dtype
            and x.shape[1] == router.shape[1] and router.stride(1) == 1
            and moe_routing.route_fits(router.shape[0], top_k)
            and moe_small.takes(x.shape[0] * top_k, fp8))


MAX_ROUTED_ROWS = 2


def routed_experts(x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool,
                   gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0,
                   scales: tuple | None = None, tiles: tuple | None = None,
                   each: bool = False) -> torch.Tensor | None:
    """The router (moe_router.route_from_hidden's logits and routing) and the experts in one
    launch: a program per expert's logit first, the last of them routing every row (each:
    every experts' tile routing its token from the logits), then the experts' tiles, which
    wait for the routing (each: for the logits). gate_up [E, 2 I, H] or [E, 2, I, H]. None
    where the counters are not at hand."""
    if gate_up.dim() == 3:
        gate_up = gate_up.unflatten(1, (2, gate_up.shape[1] // 2))
    if scales is not None and scales[0].dim() == 3:
        scales = (scales[0].unflatten(1, (2, scales[0].shape[1] // 2)), scales[1])
    tokens = x.shape[0]
    weights = torch.empty(tokens, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=x.device)
    return _launch(x, weights, ids, router, renormalize, gate_up, down, first_expert, scales,
                   tiles, 2 if each else 1)


def _launch(x, weights, ids, router, renormalize, gate_up, down, first_expert, scales, tiles,
            route):
    pool = counters(x.device)
    if pool is None:
        return None
    gate_up_scale, down_scale = scales or (None, None)
    gate_up, down = (w if w.stride(-1) == 1 else w.contiguous() for w in (gate_up, down))
    x = x if x.stride(-1) == 1 else x.contiguous()
    tokens, top_k = ids.shape
    num_local, inter, hidden = gate_up.shape[0], gate_up.shape[2], gate_up.shape[3]
    up_n, up_k, down_n, down_k, warps = tiles or choose(tokens, top_k, inter, hidden,
                                                        gate_up.element_size(), x.device)
    vec = VEC_BYTES // gate_up.element_size()
    if up_k % vec or down_k % vec:
        raise ValueError(f"the K steps {up_k}, {down_k} must be multiples of {vec}")
    h = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    up_tiles = tokens * top_k * triton.cdiv(inter, up_n)
    num_experts = 0 if router is None else router.shape[0]
    logits = None if router is None else torch.empty(tokens, num_experts, dtype=torch.float32,
                                                     device=x.device)
    programs = num_experts + up_tiles + tokens * triton.cdiv(hidden, down_n)
    w_scaled = gate_up_scale is not None
    _one_launch_kernel[(programs,)](
        out, h, x, ids, weights, gate_up, gate_up_scale if w_scaled else h, down,
        down_scale if w_scaled else out, pool, out if router is None else router,
        out if logits is None else logits, num_experts, num_experts, num_local, first_expert,
        tokens, top_k, inter, hidden, up_tiles, programs, x.stride(0), h.stride(0),
        out.stride(0), 0 if router is None else router.stride(0), *gate_up.stride()[:3],
        *(gate_up_scale.stride()[:3] if w_scaled else (0, 0, 0)), down.stride(0),
        down.stride(1), *((down_scale.stride(0), down_scale.stride(1)) if w_scaled else (0, 0)),
        TOP_K=triton.next_power_of_2(top_k), UP_N=up_n, UP_K=up_k, DOWN_N=down_n,
        DOWN_K=down_k, VEC=vec, W_SCALED=w_scaled, EVEN_UP_K=hidden % up_k == 0,
        EVEN_DOWN_K=inter % down_k == 0, ROUTE=route,
        ROWS=triton.next_power_of_2(tokens), ROUTER_K=triton.next_power_of_2(hidden),
        EXPERTS=triton.next_power_of_2(max(num_experts, 1)), RENORMALIZE=bool(renormalize),
        SLEEP_NS=sleep_ns(), LIBDEVICE=x.is_cuda, num_warps=warps, enable_fp_fusion=False,
        **pdl.launch_options(x.device))
    return out


def sleep_ns() -> int:
    """PARASHIFT_MOE_SMALL_ONE_SLEEP_NS (0 by default: none), read at each launch."""
    value = os.environ.get(SLEEP_ENV, "0")
    if not value.isdigit():
        raise ValueError(f"{SLEEP_ENV} must be a whole number of nanoseconds, got {value!r}")
    return int(value)


def choose(tokens: int, top_k: int, inter: int, hidden: int, weight_bytes: int,
           device: torch.device) -> tuple[int, int, int, int, int]:
    """PARASHIFT_MOE_SMALL_ONE_TILES's, else the two-launch path's tiles at gate_up's 4
    warps: its down tile at half the columns (the same bytes a thread a step)."""
    value = os.environ.get(TILES_ENV)
    if value:
        return _tiles_from(value)
    (up_n, up_k, up_warps), (down_n, down_k, down_warps) = choose_tiles(
        tokens, top_k, inter, hidden, weight_bytes, device)
    return up_n, up_k, max(1, down_n * up_warps // down_warps), down_k, up_warps


def _tiles_from(value: str) -> tuple[int, int, int, int, int]:
    parts = value.split(",")
    if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 and int(p) & (int(p) - 1) == 0
                                  for p in parts):
        raise ValueError(f"{TILES_ENV} must be five powers of two \"n,k,n,k,warps\", "
                         f"got {value!r}")
    return tuple(int(p) for p in parts)
