"""The active plan of this process and the process groups it uses.

Layers ask here for their group, rank and shard; nothing reads the global
world size. With one device the plan is trivial and every group is None."""
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parashift.parallel.plan import Plan, SINGLE_DEVICE


@dataclass
class GroupHandle:
    size: int = 1
    rank: int = 0
    group: "dist.ProcessGroup | None" = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


_plan: Plan = SINGLE_DEVICE
_tp = GroupHandle()


def get_plan() -> Plan:
    return _plan


def get_tp() -> GroupHandle:
    return _tp


@contextmanager
def use_plan(plan: Plan, tp: GroupHandle | None = None):
    """Make `plan` (and its TP group) the active one for the duration."""
    global _plan, _tp
    saved = (_plan, _tp)
    _plan, _tp = plan, tp or GroupHandle(plan.tp, plan.tp_rank, None)
    try:
        yield
    finally:
        _plan, _tp = saved
