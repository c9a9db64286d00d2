"""The canonical order of a row-parallel projection's contraction, the same on every plan.

K is cut into `chunks` equal chunks; a rank at position p of a TP group of size t holds
input columns p·K/t .. (p+1)·K/t (its base shard, a shift plan's slice, alike), that is
chunks p·chunks/t .. (p+1)·chunks/t - 1. It computes those chunks' partials, the group
gathers them in position order, and every rank adds all of them in chunk order: the
single-device run adds the same partials in the same order."""
import math

import torch

from parashift.deterministic.matmul import chunk_partials, reduce_chunks, sum_chunks
from parashift.parallel.state import GroupHandle

MAX_TP = 8  # chunks serve every TP degree up to this that the model allows


def allowed_tp_degrees(hf_config, limit: int = MAX_TP) -> list[int]:
    """TP degrees up to `limit` the model splits into: its heads, its KV heads (split or
    replicated) and its MLP width."""
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    return [d for d in range(1, limit + 1)
            if heads % d == 0 and hf_config.intermediate_size % d == 0
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
                f"(TP degrees it allows: {allowed_tp_degrees(hf_config)})")


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        tp: GroupHandle, chunks: int) -> torch.Tensor:
    """x [.., K/t] @ weight [N, K/t].T summed over the TP group in the canonical order,
    plus bias (added once, after the sum), in x's dtype."""
    if chunks % tp.size:
        raise ValueError(f"deterministic mode: tp = {tp.size} does not divide the "
                         f"{chunks} K chunks")
    if tp.size == 1:
        return reduce_chunks(x, weight, bias, chunks)
    lead = x.shape[:-1]
    partials = chunk_partials(x.reshape(-1, x.shape[-1]), weight, chunks // tp.size)
    return sum_chunks(tp.all_gather(partials, dim=0), bias, x.dtype).unflatten(0, lead)
