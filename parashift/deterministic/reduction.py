"""The canonical order of a row-parallel projection's contraction, the same on every plan.

K is cut into `chunks` equal chunks; a rank at position p of a TP group of size t holds
input columns p·K/t .. (p+1)·K/t (its base shard, a shift plan's slice, alike), that is
chunks p·chunks/t .. (p+1)·chunks/t - 1. It computes those chunks' partials, the group
gathers them in position order, and every rank adds all of them in chunk order: the
single-device run adds the same partials in the same order.

A chain passes the running sum along the group instead: rank p adds its chunks, in order,
to the fp32 sum of the chunks before them (rank p - 1's), and the last rank adds the bias and
rounds; each hop and the result's return is an all-gather of one tensor per rank. The same
additions in the same order (the same bits), t collectives of one partial instead of one of
chunks / t partials per rank: fewer bytes where the rows are many, more latency where they
are few. PARASHIFT_DETERMINISTIC_TP_SUM picks: `auto` (the default) chains from
CHAIN_FROM_ROWS rows on, `gather` and `chain` always. On two H200s, 8B shape, TP=2
(docs/benchmarks.md, twelfth session) the chain took 0.89x the gather's decode step at 64
rows, 0.87x at 256 and 0.72x the prefill of 4096 tokens, and 1.14x at one row. Read at each
call (every rank of the engine reads the same environment)."""
import math
import os

import torch

from parashift.deterministic.matmul import chunk_partials, reduce_chunks, sum_chunks
from parashift.parallel.state import GroupHandle

MAX_TP = 8  # chunks serve every TP degree up to this that the model allows


def mlp_widths(hf_config) -> list[int]:
    """The contraction widths of the model's down projections: the dense MLP's and, for a
    mixture of experts, the experts' (Qwen3-MoE's moe_intermediate_size; Mixtral's experts
    are intermediate_size wide). One canonical order serves both moe_parallel modes, so the
    experts' width must hold the chunks even where EP does not split it."""
    moe_width = getattr(hf_config, "moe_intermediate_size", None)
    return [hf_config.intermediate_size, *([moe_width] if moe_width else [])]


def allowed_tp_degrees(hf_config, limit: int = MAX_TP) -> list[int]:
    """TP degrees up to `limit` the model splits into: its heads, its KV heads (split or
    replicated) and its MLP widths (experts' included)."""
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    return [d for d in range(1, limit + 1)
            if heads % d == 0 and all(width % d == 0 for width in mlp_widths(hf_config))
            and (kv_heads % d == 0 or d % kv_heads == 0)]


def reduction_chunks(hf_config) -> int:
    """The number of K chunks of every row-parallel projection: the least common multiple
    of the allowed TP degrees, so each of them holds whole chunks."""
    return math.lcm(*allowed_tp_degrees(hf_config))


def check_plans(hf_config, plans) -> None:
    """Start-up check that every plan's TP degree (a shift plan's over SP x TP too) holds
    whole chunks of the canonical order."""
    chunks = reduction_chunks(hf_config)
    for plan in plans:
        if chunks % plan.tp:
            raise ValueError(
                f"deterministic mode: plan {plan.name()} has tp = {plan.tp}, which does not "
                f"divide the {chunks} K chunks of this model's canonical reduction order "
                f"(TP degrees its heads, KV heads and MLP widths {mlp_widths(hf_config)} "
                f"allow: {allowed_tp_degrees(hf_config)})")


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        tp: GroupHandle, chunks: int) -> torch.Tensor:
    """x [.., K/t] @ weight [N, K/t].T summed over the TP group in the canonical order,
    plus bias (added once, after the sum), in x's dtype."""
    if tp.size == 1:
        return reduce_chunks(x, weight, bias, chunks)
    lead = x.shape[:-1]
    partials = chunk_partials(x.reshape(-1, x.shape[-1]), weight, chunks_held(tp, chunks))
    return sum_over_tp(partials, bias, tp, x.dtype).unflatten(0, lead)


def chunks_held(tp: GroupHandle, chunks: int) -> int:
    """How many of the `chunks` K chunks each rank of the TP group holds."""
    if chunks % tp.size:
        raise ValueError(f"deterministic mode: tp = {tp.size} does not divide the "
                         f"{chunks} K chunks")
    return chunks // tp.size


TP_SUM_MODES = ("auto", "gather", "chain")
CHAIN_FROM_ROWS = 32  # between the measured 1 (gather faster) and 64 (chain faster)


def tp_sum_mode() -> str:
    mode = os.environ.get("PARASHIFT_DETERMINISTIC_TP_SUM", "auto")
    if mode not in TP_SUM_MODES:
        raise ValueError(f"PARASHIFT_DETERMINISTIC_TP_SUM must be one of {TP_SUM_MODES}, "
                         f"got {mode!r}")
    return mode


def sum_over_tp(partials: torch.Tensor, bias: torch.Tensor | None, tp: GroupHandle,
                dtype: torch.dtype) -> torch.Tensor:
    """This rank's chunk partials [chunks / t, rows, N] added over the TP group in chunk
    order, plus bias, in `dtype`: gathered and added on every rank, or in a chain."""
    mode = tp_sum_mode()
    if mode == "chain" or (mode == "auto" and partials.shape[1] >= CHAIN_FROM_ROWS):
        return chain_over_tp(partials, bias, tp, dtype)
    return sum_chunks(tp.all_gather(partials, dim=0), bias, dtype)


def chain_over_tp(partials: torch.Tensor, bias: torch.Tensor | None, tp: GroupHandle,
                  dtype: torch.dtype) -> torch.Tensor:
    """The chunk-order sum passed from rank to rank in position order; at each hop only
    one rank's tensor is read (the others send a placeholder of its shape)."""
    running = None
    for hop in range(tp.size - 1):
        mine = (sum_chunks(partials, None, torch.float32, running) if tp.rank == hop
                else partials[0])
        running = tp.all_gather(mine.unsqueeze(0), dim=0)[hop]
    last = tp.size - 1
    mine = (sum_chunks(partials, bias, dtype, running) if tp.rank == last
            else partials.new_empty(partials.shape[1:], dtype=dtype))
    return tp.all_gather(mine.unsqueeze(0), dim=0)[last]
