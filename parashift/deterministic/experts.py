"""A mixture of experts in deterministic mode: every token-slot pair (t, j) computes
y[t, j] = down_e(silu(gate_e x_t) * up_e x_t) for its expert e = ids[t, j] with the
batch-invariant GEMMs, and out[t] = sum over j, in slot order, of w[t, j] * y[t, j] in fp32,
rounded once to x's dtype.

The down projection's contraction (the expert's intermediate width) is the one that TP
splits: it is cut into the model's canonical K chunks, each rank computes the chunks it
holds and the TP group gathers and adds them in the canonical order, as a row-parallel
projection does (`reduction.py`); one device holds every chunk. Under EP each pair is
computed whole on the one rank holding its expert and is zero elsewhere, so summing the
ranks' slot outputs adds one value to zeros, exactly.

The cost: one pass of the batch-invariant GEMMs per expert that has tokens (a host sync for
the routing), fp32 slot outputs [T, k, H] (gathered over TP as terms, or summed over EP)
instead of the grouped kernel's outputs; no CUDA graphs."""
from collections.abc import Iterator

import torch

from parashift.deterministic.elementwise import silu_and_mul
from parashift.deterministic.matmul import chunk_partials, linear, ordered_sum, sum_chunks
from parashift.deterministic.reduction import row_groups


def slot_partials(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor, chunks: int, first_expert: int = 0) -> torch.Tensor:
    """[chunks, T * k, H] fp32: for each pair (t, j), slot-major, routed to an expert held
    here (first_expert .. first_expert + len(gate_up) - 1), the partials of its output over
    `chunks` equal slices of the intermediate width held; zero for pairs routed elsewhere."""
    partials = x.new_zeros((chunks, ids.numel(), down.shape[1]), dtype=torch.float32)
    for pairs, expert_partials in held_pair_partials(x, ids, gate_up, down, chunks,
                                                     first_expert):
        partials[:, pairs] = expert_partials
    return partials


def slot_outputs(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                 chunks: int, first_expert: int = 0) -> torch.Tensor:
    """[T * k, H] fp32: slot_partials added in the canonical order (every chunk held here),
    one expert at a time: 1/chunks of the memory, the same sums."""
    slots = x.new_zeros((ids.numel(), down.shape[1]), dtype=torch.float32)
    for pairs, expert_partials in held_pair_partials(x, ids, gate_up, down, chunks,
                                                     first_expert):
        slots[pairs] = sum_chunks(expert_partials, None, torch.float32,
                                  groups=row_groups(chunks))
    return slots


def held_pair_partials(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                       down: torch.Tensor, chunks: int, first_expert: int
                       ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(pairs, their chunk partials [chunks, n, H]) of each expert held here with pairs."""
    top_k = ids.shape[1]
    local_ids = ids.flatten() - first_expert
    for expert in local_ids.unique().tolist():
        if not 0 <= expert < gate_up.shape[0]:
            continue  # another rank's expert
        pairs = (local_ids == expert).nonzero().squeeze(1)
        h = silu_and_mul(linear(x[pairs // top_k], gate_up[expert].flatten(0, -2), None))
        yield pairs, chunk_partials(h, down[expert], chunks)


def weighted_slot_sum(slots: torch.Tensor, weights: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    """out[t] = sum over j in slot order of weights[t, j] * slots[t * k + j], in fp32,
    rounded once to `dtype`; [T, H]."""
    per_slot = weights.float().unsqueeze(-1) * slots.unflatten(0, weights.shape)
    return ordered_sum(per_slot.transpose(0, 1)).to(dtype)
