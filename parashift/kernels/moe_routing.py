"""A decode step's MoE routing in two launches per layer instead of ~25 small torch ops (each
~3-5 µs inside a CUDA graph: most of a Qwen3-30B-A3B batch-1 step, docs/benchmark_log.md).

`route`: one program per token: fp32 softmax over the experts, the top k (the lowest expert id
first among equal probabilities), renormalized when asked; what layers.fused_moe.route
computes, up to the order of the softmax's sum.

`sort_pairs`: the token-expert pairs laid out expert by expert, each expert's run padded to
a multiple of block_m rows, pairs of one expert in pair order: the same rows and block experts
as kernels.fused_moe.sort_pairs_torch (their reference). Up to MAX_PAIRS pairs (decode) one
program does it from comparison matrices ([experts, pairs], [pairs, pairs], [blocks,
experts]); more (prefill) take two launches of a program per chunk of pairs and expert: one
counts the chunk's pairs of the expert, the next places them from its run's start (the
padded counts of the experts before it) plus its pairs in the chunks before, ranking them by
a cumulative sum over the chunk's pairs in order (a program per expert scanning all 32,768
pairs of a 4,096-token prefill took 32 us a layer on an H200)."""
import torch
import triton
import triton.language as tl

from parashift.kernels import pdl

MAX_PAIRS = 128  # pairs one program sorts; more take a program per expert
MAX_EXPERTS = 256


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_logits,
                  TOP_K: tl.constexpr, EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr,
                  USE_PDL: tl.constexpr = 0):
    pdl.start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS)
    held = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_logits + experts, mask=held,
                     other=-float("inf")).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    route_row(logits, held, weights_ptr + token * TOP_K, ids_ptr + token * TOP_K, TOP_K,
              EXPERTS, RENORMALIZE)


@triton.jit
def route_row(logits, held, weights_row_ptr, ids_row_ptr, TOP_K: tl.constexpr,
              EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token's routing from its fp32 logits [EXPERTS] (-inf where not `held`): the k
    weights (in weights_row_ptr's dtype) and expert ids (int64) stored."""
    chosen, chosen_ids = route_values(logits, held, TOP_K, EXPERTS, RENORMALIZE)
    slots = tl.arange(0, TOP_K)
    # rounded once to the logits' dtype, as torch's .to() of the fp32 weights rounds them
    tl.store(weights_row_ptr + slots, chosen.to(weights_row_ptr.dtype.element_ty))
    tl.store(ids_row_ptr + slots, chosen_ids)


@triton.jit
def route_values(logits, held, TOP_K: tl.constexpr, EXPERTS: tl.constexpr,
                 RENORMALIZE: tl.constexpr):
    """route_row's k weights (fp32, before their rounding) and expert ids (int64), [TOP_K]
    each, in the program's registers."""
    experts = tl.arange(0, EXPERTS)
    exps = tl.where(held, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
    probs = exps / tl.sum(exps, axis=0)
    # one key an expert, ordered as the picks are (the larger probability, then the lower
    # id): a non-negative float's bits, as an integer, order as the float does; so each pick
    # is one max (two reductions a pick took ~2 us a row on an H200)
    key = ((probs.to(tl.int32, bitcast=True).to(tl.int64) << 32)
           | (EXPERTS - 1 - experts).to(tl.int64))
    key = tl.where(held, key, -1)
    slots = tl.arange(0, TOP_K)
    chosen = tl.zeros([TOP_K], dtype=tl.float32)
    chosen_ids = tl.zeros([TOP_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        top = tl.max(key, axis=0)
        pick = EXPERTS - 1 - (top & 0xFFFFFFFF)
        best = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        chosen = tl.where(slots == j, best, chosen)
        chosen_ids = tl.where(slots == j, pick, chosen_ids)
        key = tl.where(experts == pick, -1, key)
    if RENORMALIZE:
        chosen = chosen / tl.sum(chosen, axis=0)
    return chosen, chosen_ids


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in the logits' dtype, expert ids [T, k] int64)."""
    tokens, num_experts = router_logits.shape
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    weights = torch.empty(tokens, top_k, dtype=router_logits.dtype, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        _route_kernel[(tokens,)](logits, weights, ids, num_experts, logits.stride(0),
                                 TOP_K=top_k, EXPERTS=triton.next_power_of_2(num_experts),
                                 RENORMALIZE=renormalize, num_warps=1 if num_experts <= 128 else 2,
                                 **pdl.launch_options(logits.device))
    return weights, ids


def route_fits(num_experts: int, top_k: int) -> bool:
    # the k chosen are held in a vector of TOP_K slots: tl.arange's lengths are powers of two
    return num_experts <= MAX_EXPERTS and top_k & (top_k - 1) == 0


@triton.jit
def _sort_pairs_kernel(ids_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs, num_local,
                       first_expert, rows, num_blocks, PAIRS: tl.constexpr,
                       EXPERTS: tl.constexpr, BLOCK_M: tl.constexpr, FILL: tl.constexpr,
                       BLOCKS: tl.constexpr, USE_PDL: tl.constexpr = 0):
    pdl.start(USE_PDL)
    pairs = tl.arange(0, PAIRS)
    experts = tl.arange(0, EXPERTS)
    real = pairs < num_pairs
    local = (tl.load(ids_ptr + pairs, mask=real, other=0) - first_expert).to(tl.int32)
    pdl.inputs_read(USE_PDL)
    held = real & (local >= 0) & (local < num_local)
    local = tl.where(held, local, EXPERTS)  # a bin no expert index reaches
    in_expert = local[None, :] == experts[:, None]  # [experts, pairs]
    counts = tl.sum(in_expert.to(tl.int32), axis=1)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    start = padded_end - padded
    earlier_same = (local[:, None] == local[None, :]) & (pairs[None, :] < pairs[:, None])
    rank = tl.sum(earlier_same.to(tl.int32), axis=1)
    dest = tl.sum(tl.where(in_expert, start[:, None], 0), axis=0) + rank
    for row0 in range(0, rows, FILL):
        offs = row0 + tl.arange(0, FILL)
        tl.store(pair_of_row_ptr + offs, tl.full([FILL], 0, tl.int64) + num_pairs,
                 mask=offs < rows)  # the sentinel: no pair
    tl.debug_barrier()  # the sentinel rows are written before the pairs overwrite theirs
    tl.store(pair_of_row_ptr + dest, pairs.to(tl.int64), mask=held)
    counted = experts < num_local
    for block0 in range(0, num_blocks, BLOCKS):
        blocks = block0 + tl.arange(0, BLOCKS)
        ended = (padded_end[None, :] <= blocks[:, None] * BLOCK_M) & counted[None, :]
        tl.store(block_expert_ptr + blocks, tl.sum(ended.to(tl.int32), axis=1).to(tl.int64),
                 mask=blocks < num_blocks)


@triton.jit
def _count_pairs_kernel(ids_ptr, counts_ptr, num_pairs, first_expert, num_local,
                        CHUNK: tl.constexpr, USE_PDL: tl.constexpr = 0):
    """Program (c, e): how many pairs of chunk c chose local expert e, to counts[c, e]."""
    pdl.start(USE_PDL)
    chunk, expert = tl.program_id(0), tl.program_id(1)
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    local = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1) - first_expert
    pdl.inputs_read(USE_PDL)
    tl.store(counts_ptr + chunk * num_local + expert, tl.sum((local == expert).to(tl.int32), 0))


@triton.jit
def _place_pairs_kernel(ids_ptr, counts_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs,
                        num_local, first_expert, rows, num_chunks, EXPERTS: tl.constexpr,
                        CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                        USE_PDL: tl.constexpr = 0):
    """Program (c, e < num_local): chunk c's pairs of expert e in pair order, from its run's
    padded start plus its pairs in the chunks before; chunk 0's also the sentinel rows to
    the end of the run and its blocks' expert. Program (0, num_local): the rows and blocks
    past the last run."""
    pdl.start(USE_PDL)
    chunk, expert = tl.program_id(0), tl.program_id(1)
    experts = tl.arange(0, EXPERTS)
    chunks = tl.arange(0, CHUNKS)
    counts = tl.load(counts_ptr + chunks[:, None] * num_local + experts[None, :],
                     mask=(chunks < num_chunks)[:, None] & (experts < num_local)[None, :],
                     other=0)
    totals = tl.sum(counts, axis=0)
    padded = (totals + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(experts < expert, padded, 0), axis=0)
    if expert < num_local:
        mine_before = (chunks[:, None] < chunk) & (experts[None, :] == expert)
        first_row = start + tl.sum(tl.sum(tl.where(mine_before, counts, 0), axis=1), axis=0)
        pairs = chunk * CHUNK + tl.arange(0, CHUNK)
        local = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1) - first_expert
        mine = local == expert
        dest = first_row + tl.cumsum(mine.to(tl.int32), axis=0) - 1
        tl.store(pair_of_row_ptr + dest, pairs.to(tl.int64), mask=mine)
    pdl.inputs_read(USE_PDL)
    if chunk == 0:
        placed = start + tl.sum(tl.where(experts == expert, totals, 0), axis=0)
        end = start + tl.sum(tl.where(experts == expert, padded, 0), axis=0)
        if expert == num_local:
            end = rows
        for row0 in range(placed, end, CHUNK):  # the run's padding (the tail: all sentinel)
            offs = row0 + tl.arange(0, CHUNK)
            tl.store(pair_of_row_ptr + offs, tl.full([CHUNK], 0, tl.int64) + num_pairs,
                     mask=offs < end)
        for block0 in range(start // BLOCK_M, end // BLOCK_M, CHUNK):
            blocks = block0 + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + blocks, tl.full([CHUNK], 0, tl.int64) + expert,
                     mask=blocks < end // BLOCK_M)


MAX_CHUNKS = 32  # of the pairs in the sort's two launches: larger chunks past 32 of 1,024


@triton.jit
def block_pairs(pair_ptr, block, num_pairs, a_row_div, BLOCK_M: tl.constexpr):
    """A grouped GEMM program's sorted rows: (their pair ids, which are pairs (not padding),
    the activation row each reads: pair // a_row_div)."""
    pairs = tl.load(pair_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    return pairs, pairs < num_pairs, (pairs // a_row_div).to(tl.int64)


def sort_fits(num_pairs: int, num_local: int) -> bool:
    return num_local <= MAX_EXPERTS


def sort_pairs(ids: torch.Tensor, num_local: int, first_expert: int, block_m: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels.fused_moe.sort_pairs in one launch (at most MAX_PAIRS pairs) or two (a program
    per chunk of pairs and expert counting, then one placing them)."""
    num_pairs = ids.numel()
    rows = num_pairs + num_local * (block_m - 1)
    rows = (rows + block_m - 1) // block_m * block_m
    pair_of_row = torch.empty(rows, dtype=torch.int64, device=ids.device)
    block_expert = torch.empty(rows // block_m, dtype=torch.int64, device=ids.device)
    ids = ids.contiguous()
    experts = max(16, triton.next_power_of_2(num_local))
    if num_pairs <= MAX_PAIRS:
        _sort_pairs_kernel[(1,)](ids, pair_of_row, block_expert, num_pairs, num_local,
                                 first_expert, rows, rows // block_m,
                                 PAIRS=max(16, triton.next_power_of_2(num_pairs)),
                                 EXPERTS=experts, BLOCK_M=block_m, FILL=256, BLOCKS=16,
                                 num_warps=4, **pdl.launch_options(ids.device))
        return pair_of_row, block_expert
    chunk = max(1024, triton.next_power_of_2(triton.cdiv(num_pairs, MAX_CHUNKS)))
    chunks = triton.cdiv(num_pairs, chunk)
    counts = torch.empty(chunks, num_local, dtype=torch.int32, device=ids.device)
    _count_pairs_kernel[(chunks, num_local)](ids, counts, num_pairs, first_expert, num_local,
                                             CHUNK=chunk, **pdl.launch_options(ids.device))
    _place_pairs_kernel[(chunks, num_local + 1)](
        ids, counts, pair_of_row, block_expert, num_pairs, num_local, first_expert, rows,
        chunks, EXPERTS=experts, CHUNKS=max(2, triton.next_power_of_2(chunks)),
        BLOCK_M=block_m, CHUNK=chunk, **pdl.launch_options(ids.device))
    return pair_of_row, block_expert
