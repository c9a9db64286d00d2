"""A rank's parallel state with no peers: layers built and run on one process as one rank
of a TP group would (its shard), the all-reduce returning the rank's partial sum."""
from parashift.parallel.plan import Plan
from parashift.parallel.state import GroupHandle, ParallelState


class FakeGroup(GroupHandle):
    """A TP group of this rank alone: the row-parallel all-reduce returns the partial sum."""

    def all_reduce(self, x):
        return x


def tp_state(tp_size: int, tp_rank: int) -> ParallelState:
    tp = FakeGroup(tuple(range(tp_size)), tp_rank)
    return ParallelState(Plan(tp=tp_size), tp_rank, tp, GroupHandle(), GroupHandle(), GroupHandle())
