"""A parallel plan: how a group of ranks splits one forward step.

A plan is a value. Building one allocates nothing; the communicator pool maps
its groups to process groups created once at start-up.

Rank layout, innermost first: tp, sp, pp, dp —
rank = ((dp_rank * pp + pp_rank) * sp + sp_rank) * tp + tp_rank."""
from dataclasses import dataclass

GROUP_KINDS = ("tp", "sp", "pp", "dp", "sp_tp")


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    sp: int
    tp: int


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    pp: int = 1
    sp: int = 1
    tp: int = 1
    # Set on Shift Parallelism's shift plan: the (sp, tp) of the base plan whose SP_TP
    # group this plan's TP runs over, in that group's order (KV invariance).
    shift_base: tuple[int, int] | None = None

    def __post_init__(self):
        for name in ("dp", "pp", "sp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"plan degree {name} must be an integer >= 1, got {value!r}")
        if self.shift_base is not None and (self.sp != 1 or self.tp != self.base.attn_degree):
            raise ValueError("a shift plan is TP = sp*tp of its base plan, with sp = 1")

    def shift_plan(self) -> "Plan":
        """Shift Parallelism's plan for this base plan: TP over the SP_TP group."""
        return Plan(self.dp, self.pp, 1, self.attn_degree, shift_base=(self.sp, self.tp))

    @property
    def base(self) -> "Plan":
        """The plan whose weight shards and head layout this plan uses."""
        if self.shift_base is None:
            return self
        return Plan(self.dp, self.pp, *self.shift_base)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.sp * self.tp

    @property
    def attn_degree(self) -> int:
        """Ranks over which one layer's attention heads are split (Ulysses SP x TP)."""
        return self.sp * self.tp

    def name(self) -> str:
        name = "x".join(f"{k}{getattr(self, k)}" for k in ("dp", "pp", "sp", "tp")
                        if getattr(self, k) > 1) or "single"
        return f"shift-{name}" if self.shift_base else name

    # ---- rank layout ---------------------------------------------------------
    def rank_of(self, c: Coords) -> int:
        return ((c.dp * self.pp + c.pp) * self.sp + c.sp) * self.tp + c.tp

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        tp, rest = rank % self.tp, rank // self.tp
        sp, rest = rest % self.sp, rest // self.sp
        pp, dp = rest % self.pp, rest // self.pp
        return Coords(dp, pp, sp, tp)

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every group of this kind, as rank tuples in the group's own order."""
        if kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {kind!r}")
        seen: dict[tuple, None] = {}
        for rank in range(self.world_size):
            seen.setdefault(self.group_of(kind, rank), None)
        return list(seen)

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        if self.shift_base is not None:
            return self._shift_group_of(kind, rank)
        c = self.coords(rank)
        vary = {
            "tp": lambda i: Coords(c.dp, c.pp, c.sp, i),
            "sp": lambda i: Coords(c.dp, c.pp, i, c.tp),
            "pp": lambda i: Coords(c.dp, i, c.sp, c.tp),
            "dp": lambda i: Coords(i, c.pp, c.sp, c.tp),
        }
        if kind == "sp_tp":
            # TP over all sp*tp ranks with the heads each rank holds under (sp, tp):
            # position tp_rank * sp + sp_rank (Shift Parallelism §3.3.1).
            return tuple(self.rank_of(Coords(c.dp, c.pp, s, t))
                         for t in range(self.tp) for s in range(self.sp))
        degree = getattr(self, kind)
        return tuple(self.rank_of(vary[kind](i)) for i in range(degree))

    def _shift_group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        base = self.base
        if kind in ("tp", "sp_tp"):
            return base.group_of("sp_tp", rank)
        if kind == "sp":
            return (rank,)
        return base.group_of(kind, rank)

    def vocab_group_of(self, rank: int) -> tuple[int, ...]:
        """Ranks that split the vocabulary (embedding, LM head): the base plan's TP group."""
        return self.base.group_of("tp", rank)

    # ---- what each rank holds ------------------------------------------------
    def head_block(self, rank: int) -> int:
        """Index of this rank's block of attention heads (of attn_degree blocks)."""
        c = self.base.coords(rank)
        return c.tp * self.base.sp + c.sp

    def stage_layers(self, num_layers: int, pp_rank: int) -> range:
        """Layers of one pipeline stage: as even as possible, earlier stages one more."""
        if num_layers < self.pp:
            raise ValueError(f"{num_layers} layers cannot fill {self.pp} pipeline stages")
        base, extra = divmod(num_layers, self.pp)
        start = pp_rank * base + min(pp_rank, extra)
        return range(start, start + base + (pp_rank < extra))

    def check_model(self, num_heads: int, num_kv_heads: int, num_layers: int,
                    intermediate_size: int | None = None) -> None:
        """Start-up check that the model can be split this way; names valid degrees."""
        if intermediate_size is not None and intermediate_size % self.tp:
            raise ValueError(f"the MLP width {intermediate_size} cannot be split over tp = {self.tp}")
        degree = self.attn_degree
        valid = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        if num_heads % degree:
            raise ValueError(f"{num_heads} attention heads cannot be split over sp*tp = {degree} "
                             f"ranks; valid sp*tp degrees: {valid}")
        if num_kv_heads % degree and degree % num_kv_heads:
            raise ValueError(f"{num_kv_heads} KV heads cannot be split or replicated over sp*tp = "
                             f"{degree} ranks; use a divisor or a multiple of {num_kv_heads}")
        self.stage_layers(num_layers, 0)


def describe(plan: Plan, num_layers: int | None = None, num_heads: int | None = None,
             num_kv_heads: int | None = None) -> str:
    """A table of every rank's coordinates and holdings, then every group."""
    lines = [f"plan {plan.name()}: dp={plan.dp} pp={plan.pp} sp={plan.sp} tp={plan.tp} "
             f"(world {plan.world_size})"]
    for rank in range(plan.world_size):
        c = plan.coords(rank)
        line = f"  rank {rank}: dp={c.dp} pp={c.pp} sp={c.sp} tp={c.tp} head block {plan.head_block(rank)}"
        if num_layers:
            layers = plan.stage_layers(num_layers, c.pp)
            line += f", layers {layers.start}-{layers.stop - 1}"
        if num_heads:
            per = num_heads // plan.attn_degree
            first = plan.head_block(rank) * per
            line += f", q heads {first}-{first + per - 1}"
        if num_kv_heads:
            line += f", {max(1, num_kv_heads // plan.attn_degree)} KV head(s)"
        lines.append(line)
    for kind in GROUP_KINDS:
        groups = [g for g in plan.groups(kind) if len(g) > 1]
        if groups:
            lines.append(f"  {kind} groups: " + " ".join(str(list(g)) for g in groups))
    return "\n".join(lines)
