"""A plan seen from one rank: its process groups, each as a `GroupHandle`.

Layers get the active one from the step context (parashift/context.py); nothing
reads the global world size. With one device every group has size 1."""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parashift.parallel.plan import Plan


# torch 2.13 renamed all_gather_into_tensor (the GPU image's 2.11 has only the old name)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GroupHandle:
    """A process group seen from one rank. `ranks` is the group's own order (which
    may differ from torch's sorted order, e.g. the SP_TP group); `rank` is this
    process's position in it, and gathers return parts in that order. `fast` is the
    group's symmetric-memory all-reduce (FastAllReduce), where one was set up; `pair` its
    PairExchange (deterministic mode's TP=2 sums), where one was set up."""

    def __init__(self, ranks: tuple[int, ...] = (0,), global_rank: int = 0, group=None,
                 fast=None, pair=None):
        self.ranks = tuple(ranks)
        self.size = len(ranks)
        self.rank = self.ranks.index(global_rank)
        self.group = group
        self.fast, self.pair = fast, pair
        order = sorted(ranks)
        self._torch_index = [order.index(r) for r in ranks]  # our position -> torch's
        by_torch_rank = sorted(range(self.size), key=self._torch_index.__getitem__)
        # our positions in torch's order; None where the orders are the same
        self._by_torch_rank = None if by_torch_rank == list(range(self.size)) else by_torch_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the group (may be `x` itself, reduced in place)."""
        if self.size == 1:
            return x
        if self.fast is not None:
            return self.fast.all_reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every position's `x` concatenated along `dim`, in the group's order. Along dim 0
        in torch's order the parts land in one tensor; otherwise a list, then a copy."""
        if self.size == 1:
            return x
        if dim % x.dim() == 0 and self._by_torch_rank is None:
            out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
            _all_gather_single(out, x.contiguous(), group=self.group)
            return out
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([parts[i] for i in self._torch_index], dim=dim)

    def all_to_all(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """chunks[i] goes to position i; returns what each position sent here."""
        if self.size == 1:
            return chunks
        send = [None] * self.size
        for pos, chunk in enumerate(chunks):
            send[self._torch_index[pos]] = chunk.contiguous()
        recv = [torch.empty_like(c) for c in send]
        dist.all_to_all(recv, send, group=self.group)
        return [recv[i] for i in self._torch_index]

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """This position's part of the sum of `x` over the group, `x` cut along dim 0 into
        one part per position (in the group's order). Gloo has no reduce-scatter: there it
        is an all-reduce, then this rank's part."""
        if self.size == 1:
            return x
        parts = x.unflatten(0, (self.size, -1))
        if not x.is_cuda:
            dist.all_reduce(parts, group=self.group)
            return parts[self.rank]
        if self._by_torch_rank is not None:  # slices, not an index tensor: a host copy
            x = torch.cat([parts[i] for i in self._by_torch_rank])  # breaks graph capture
        out = torch.empty_like(parts[0])
        dist.reduce_scatter_tensor(out, x, group=self.group)
        return out

    def all_gather_object(self, obj) -> list:
        """Every position's `obj` (picklable), in the group's order."""
        if self.size == 1:
            return [obj]
        gathered = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self.group)
        return [gathered[i] for i in self._torch_index]

    def peer(self, position: int) -> int:
        return self.ranks[position]


@dataclass
class ParallelState:
    plan: Plan
    rank: int
    tp: GroupHandle
    sp: GroupHandle
    pp: GroupHandle
    dp: GroupHandle
    vocab: GroupHandle | None = None  # splits the vocabulary; the TP group unless a shift plan
    # splits the experts under expert parallelism: the base plan's SP_TP group (Plan.ep_group_of);
    # None: the TP group where there is no SP
    ep: GroupHandle | None = None
    # SiDP (Plan.shared_ffn): the replicas' ranks at this TP position, which exchange FFN
    # tokens; and the shard the FFN weights are built and loaded as (TP = d*t, this rank's
    # position), a handle with no process group, read when layers are built. None: the TP
    # group's.
    ffn: GroupHandle | None = None
    ffn_shard: GroupHandle | None = None

    def __post_init__(self):
        if self.vocab is None:
            self.vocab = self.tp
        if self.ep is None and self.sp.size == 1:
            self.ep = self.tp

    @classmethod
    def single(cls) -> "ParallelState":
        return cls(Plan(), 0, GroupHandle(), GroupHandle(), GroupHandle(), GroupHandle())

    @classmethod
    def unconnected(cls, plan: Plan, rank: int) -> "ParallelState":
        """`rank`'s view of `plan` with no process group: enough to build its model's
        structure (or load it alone), not to run it."""
        def handle(ranks):
            return GroupHandle(ranks, rank)
        groups = (handle(plan.group_of(kind, rank)) for kind in ("tp", "sp", "pp", "dp"))
        state = cls(plan, rank, *groups, handle(plan.vocab_group_of(rank)),
                    handle(plan.ep_group_of(rank)))
        if plan.shared_ffn is not None:
            state.ffn = handle(plan.group_of("ffn", rank))
            state.ffn_shard = handle(plan.ffn_shard_ranks())
        return state

    @property
    def is_first_stage(self) -> bool:
        return self.pp.rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp.rank == self.pp.size - 1
