"""A parallel plan: how a group of ranks splits one forward step.

A plan is a value. Building one allocates nothing; the communicator pool
(later) maps its groups to process groups created at start-up."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    pp: int = 1
    sp: int = 1
    tp: int = 1
    rank: int = 0  # this process's global rank

    def __post_init__(self):
        for name in ("dp", "pp", "sp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"plan degree {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside a world of {self.world_size}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.sp * self.tp

    # Rank layout, innermost first: tp, sp, pp, dp.
    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def sp_rank(self) -> int:
        return (self.rank // self.tp) % self.sp

    @property
    def pp_rank(self) -> int:
        return (self.rank // (self.tp * self.sp)) % self.pp

    @property
    def dp_rank(self) -> int:
        return self.rank // (self.tp * self.sp * self.pp)

    def describe(self) -> str:
        return f"dp{self.dp}-pp{self.pp}-sp{self.sp}-tp{self.tp}"


SINGLE_DEVICE = Plan()
