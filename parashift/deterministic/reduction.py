"""The canonical order of a row-parallel projection's contraction, the same on every plan.

K is cut into `chunks` equal chunks in `row_groups(chunks)` groups (two halves where chunks
is even): each chunk's partial is added in chunk order from zero within its group, then the
groups' sums from zero, plus the bias, rounded once. A rank at position p of a TP group of
size t holds input columns p·K/t .. (p+1)·K/t (its base shard, a shift plan's slice,
alike), that is chunks p·chunks/t .. (p+1)·chunks/t - 1.

Each rank sends terms (`TermLayout`): a run of its chunks that begins a group is summed in
the rank's own GEMM program into one term; a chunk after the start of a group another rank
began is its own term. One all-gather of one tensor per term, then every rank adds the
terms in the canonical order. Under TP=2 each rank holds a half: one fp32 term per rank, one
collective, nothing waiting on another rank's sum (it replaced a chain that passed the
running sum from rank to rank, two dependent collectives per projection under TP=2).

Two ranks of one term each (`paired`) need no gather: an fp32 sum of two operands is one
addition, the same bits in either order. Where the pair has a `PairExchange`
(parallel/pair_exchange.py) each GEMM stores its half here and in the peer's memory, and
both add the two from their own (`add_terms`); otherwise the group's all-reduce adds them
(the one-shot kernel on NVLink), and starting the bias's sum from zero afterwards gives the
canonical order's signed zeros too (`add_pair`). On two H200s, 8B shape, TP=2's decode
step at 256 rows took 12.35 ms gathered, 12.06 all-reduced and 10.57 exchanged
(twenty-third session). PARASHIFT_DETERMINISTIC_TP_SUM picks `all_reduce` (the default:
such pairs as just said; others gather) or `gather` (always). Read at each call (every rank
of the engine reads the same environment)."""
import functools
import math
import os
from dataclasses import dataclass

import torch

from parashift.deterministic.matmul import fold_chunks, reduce_chunks, sum_chunks
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


def row_groups(chunks: int) -> int:
    """The groups of a row-parallel contraction's canonical order: halves, where they hold
    whole chunks."""
    return 2 if chunks % 2 == 0 else 1


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        tp: GroupHandle, chunks: int, step: object = None) -> torch.Tensor:
    """x [.., K/t] @ weight [N, K/t].T summed over the TP group in the canonical order,
    plus bias (added once, after the sum), in x's dtype. `step`: the forward step's
    context, which a TP pair's exchange needs (none: no exchange)."""
    if tp.size == 1:
        return reduce_chunks(x, weight, bias, chunks, row_groups(chunks))
    lead = x.shape[:-1]
    layout = term_layout(chunks, tp.size)
    x = x.reshape(-1, x.shape[-1])
    if layout.paired and tp_sum_mode() == "all_reduce" and tp.pair is not None \
            and step is not None and tp.pair.fits(x.shape[0], weight.shape[0]):
        both, mine, mirror = tp.pair.slot(x.shape[0], weight.shape[0], tp.rank, step)
        rank_terms(x, weight, layout, tp.rank, out=mine, mirror=mirror)
        tp.pair.exchange()
        return add_terms(both.unsqueeze(1), bias, x.dtype, layout).unflatten(0, lead)
    terms = rank_terms(x, weight, layout, tp.rank)
    return sum_over_tp(terms, bias, tp, x.dtype, layout).unflatten(0, lead)


def rank_terms(x: torch.Tensor, weight: torch.Tensor, layout: "TermLayout", rank: int,
               out: torch.Tensor | None = None, mirror: torch.Tensor | None = None
               ) -> torch.Tensor:
    """[terms, rows, N] fp32: the terms of `rank`'s chunks of x [rows, K/t] @ weight.T, a
    folded run summed in its GEMM programs. A rank of one term may store it in `out` (and
    `mirror`, of out's strides, a peer's: parallel/pair_exchange.py)."""
    runs = layout.runs[rank]
    width = x.shape[-1] // sum(n for _, n, _ in runs)
    if out is not None and len(runs) != 1:
        raise ValueError(f"a rank of {len(runs)} runs has no single term to store")
    terms = [fold_chunks(x[:, start * width:(start + n) * width],
                         weight[:, start * width:(start + n) * width], n, 1 if folded else n,
                         out, mirror)
             for start, n, folded in runs]
    return torch.cat(terms) if len(terms) > 1 else terms[0]


def chunks_held(tp: GroupHandle, chunks: int) -> int:
    """How many of the `chunks` K chunks each rank of the TP group holds."""
    if chunks % tp.size:
        raise ValueError(f"deterministic mode: tp = {tp.size} does not divide the "
                         f"{chunks} K chunks")
    return chunks // tp.size


@dataclass(frozen=True)
class TermLayout:
    """The terms of a TP group's canonical sum. runs[p]: rank p's chunks (local index of
    the first, count, folded) in order, a folded run one term and an unfolded run one term
    per chunk; groups[g]: group g's terms as (rank, term index), its first a folded run."""
    runs: tuple[tuple[tuple[int, int, bool], ...], ...]
    groups: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def paired(self) -> bool:
        """Two ranks, each one group's one term: their sum is one fp32 addition."""
        return self.groups == (((0, 0),), ((1, 0),))

    @property
    def width(self) -> int:
        """Terms per rank in the all-gather (the most any rank has)."""
        return max(sum(1 if folded else n for _, n, folded in runs) for runs in self.runs)


@functools.cache
def term_layout(chunks: int, tp: int) -> TermLayout:
    """The terms of `chunks` canonical chunks over a TP group of `tp` ranks."""
    if chunks % tp:
        raise ValueError(f"deterministic mode: tp = {tp} does not divide the {chunks} K chunks")
    held, group_size = chunks // tp, chunks // row_groups(chunks)
    runs, groups = [], [[] for _ in range(row_groups(chunks))]
    for rank in range(tp):
        rank_runs, term = [], 0
        for first in range(rank * held, (rank + 1) * held):
            group = first // group_size
            if first != rank * held and first % group_size:
                continue  # inside the run begun before it
            length = min((group + 1) * group_size, (rank + 1) * held) - first
            folded = first % group_size == 0
            rank_runs.append((first - rank * held, length, folded))
            for _ in range(1 if folded else length):
                groups[group].append((rank, term))
                term += 1
        runs.append(tuple(rank_runs))
    return TermLayout(tuple(runs), tuple(tuple(g) for g in groups))


def terms_of_partials(partials: torch.Tensor, layout: TermLayout, rank: int) -> torch.Tensor:
    """A rank's terms from its chunk partials [held, rows, N]: each folded run summed."""
    return torch.cat([sum_chunks(partials[start:start + n], None, torch.float32).unsqueeze(0)
                      if folded else partials[start:start + n]
                      for start, n, folded in layout.runs[rank]])


def sum_over_tp(terms: torch.Tensor, bias: torch.Tensor | None, tp: GroupHandle,
                dtype: torch.dtype, layout: TermLayout) -> torch.Tensor:
    """This rank's terms [n, rows, N] gathered over the TP group and added in the canonical
    order, plus bias, in `dtype`."""
    if layout.paired and tp_sum_mode() == "all_reduce":
        return add_pair(tp.all_reduce(terms[0]), bias, dtype)
    if terms.shape[0] < layout.width:
        terms = torch.cat([terms, terms.new_empty((layout.width - terms.shape[0],
                                                   *terms.shape[1:]))])
    return add_terms(tp.all_gather(terms.unsqueeze(0), dim=0), bias, dtype, layout)


TP_SUM_MODES = ("gather", "all_reduce")


def tp_sum_mode() -> str:
    mode = os.environ.get("PARASHIFT_DETERMINISTIC_TP_SUM", "all_reduce")
    if mode not in TP_SUM_MODES:
        raise ValueError(f"PARASHIFT_DETERMINISTIC_TP_SUM must be one of {TP_SUM_MODES}, "
                         f"got {mode!r}")
    return mode


def add_pair(total: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A paired layout's two terms summed in fp32 (in either order), plus bias, in `dtype`:
    what `add_terms` gives them."""
    return sum_chunks(total.unsqueeze(0), bias, dtype)


def add_terms(every: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
              layout: TermLayout) -> torch.Tensor:
    """Every rank's terms [t, width, rows, N] added in the canonical order, plus bias."""
    if layout.paired:
        return sum_chunks(every[:, 0], bias, dtype)
    if len(layout.groups) == 1:  # one group: its terms after its first, then the bias
        (first, *rest), = layout.groups
        return sum_chunks(torch.stack([every[term] for term in rest]), bias, dtype, every[first])
    group_sums = [every[group[0]] if len(group) == 1 else
                  sum_chunks(torch.stack([every[term] for term in group[1:]]), None,
                             torch.float32, every[group[0]])
                  for group in layout.groups]
    return sum_chunks(torch.stack(group_sums), bias, dtype)
