"""A parallel plan: how a group of ranks splits one forward step.

A plan is a value. Building one allocates nothing; the communicator pool maps
its groups to process groups created once at start-up. A plan covers its own
ranks (`ranks`, by default 0 to its size - 1), not necessarily the whole node.

Position layout within the plan's ranks, innermost first: tp, sp, pp, dp —
position = ((dp_rank * pp + pp_rank) * sp + sp_rank) * tp + tp_rank, and the
rank at a position is ranks[position]."""
import re
from dataclasses import dataclass, replace

GROUP_KINDS = ("tp", "sp", "pp", "dp", "sp_tp", "dp_tp", "ffn")
FFN_MODES = ("was", "cas")  # SiDP: Weight-as-a-Service, Compute-as-a-Service


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
    # The node's ranks this plan runs on, by position; None: 0 to world_size - 1.
    rank_set: tuple[int, ...] | None = None
    # Set on a merged plan (Flying Serving): (w, t) when w replicas of TP = t, each holding its
    # own copy of the weights, run as this one TP = w*t plan over their DP_TP group.
    merge_base: tuple[int, int] | None = None
    # Set on a SiDP replica (a plain TP plan) whose FFN weights d replicas share:
    # (mode, every sharing rank, replica by replica). Each rank holds one 1/d slice of
    # every FFN layer of its TP shard; "was" fetches the others' slices into slots, "cas"
    # runs the FFN over the replicas' gathered tokens with the slice (worker/shared_ffn.py).
    shared_ffn: tuple[str, tuple[int, ...]] | None = None

    def __post_init__(self):
        for name in ("dp", "pp", "sp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"plan degree {name} must be an integer >= 1, got {value!r}")
        if self.shift_base is not None and (self.sp != 1 or self.tp != self.base.attn_degree):
            raise ValueError("a shift plan is TP = sp*tp of its base plan, with sp = 1")
        if self.merge_base is not None and (
                self.shift_base is not None or (self.dp, self.pp, self.sp) != (1, 1, 1)
                or self.tp != self.merge_base[0] * self.merge_base[1] or self.merge_base[0] < 2):
            raise ValueError("a merged plan is TP = w*t over w >= 2 replicas of TP = t, with "
                             "dp = pp = sp = 1")
        if self.rank_set is not None:
            ranks = self.rank_set
            if len(ranks) != self.world_size or len(set(ranks)) != len(ranks) or min(ranks) < 0:
                raise ValueError(f"plan {self.name()} needs {self.world_size} distinct ranks, "
                                 f"got {list(ranks)}")
            if ranks == tuple(range(self.world_size)):
                object.__setattr__(self, "rank_set", None)  # one spelling per plan
        if self.shared_ffn is not None:
            self._check_shared_ffn()

    def _check_shared_ffn(self) -> None:
        mode, ranks = self.shared_ffn
        if mode not in FFN_MODES:
            raise ValueError(f"a shared-FFN mode is one of {FFN_MODES}, got {mode!r}")
        if (self.dp, self.pp, self.sp) != (1, 1, 1) or self.shift_base or self.merge_base:
            raise ValueError("shared FFN weights (SiDP) are for replicas of plain TP, got "
                             f"{replace(self, shared_ffn=None).name()}")
        size = self.world_size
        replicas = [tuple(ranks[i:i + size]) for i in range(0, len(ranks), size)]
        if (len(ranks) % size or len(set(ranks)) != len(ranks) or len(replicas) < 2
                or self.ranks not in replicas):
            raise ValueError(f"plan {replace(self, shared_ffn=None).name()} shares its FFN with "
                             f"ranks {list(ranks)}: they must be two or more replicas of its "
                             "size, its own ranks one of them")

    def sharing_ffn(self, mode: str, ranks: tuple[int, ...]) -> "Plan":
        """This replica plan with its FFN weights shared over `ranks` in `mode`."""
        return replace(self, shared_ffn=(mode, tuple(ranks)))

    @property
    def ffn_replicas(self) -> int:
        """How many replicas share this plan's FFN weights (1: none)."""
        return 1 if self.shared_ffn is None else len(self.shared_ffn[1]) // self.world_size

    def ffn_shard_ranks(self) -> tuple[int, ...]:
        """The sharing ranks in the order of their FFN slices: the rank at TP position t of
        replica j holds the slice at position t * d + j of the TP = d*tp shard (a merged
        plan's order), so a replica's slices together are its TP shard, in order."""
        if self.shared_ffn is None:
            return self.group_of("tp", self.ranks[0])
        sharing, size, d = self.shared_ffn[1], self.world_size, self.ffn_replicas
        return tuple(sharing[j * size + t] for t in range(self.tp) for j in range(d))

    def shift_plan(self) -> "Plan":
        """Shift Parallelism's plan for this base plan: TP over the SP_TP group."""
        return Plan(self.dp, self.pp, 1, self.attn_degree, (self.sp, self.tp), self.rank_set)

    @classmethod
    def merged(cls, replicas: list["Plan"]) -> "Plan":
        """The plan that runs `replicas` (w plans of TP = t each, over disjoint ranks) as one
        TP = w*t group; each rank keeps its replica's weights and uses its shard of them."""
        t = replicas[0].tp
        if len(replicas) < 2 or any(p != Plan(tp=t).on(p.ranks) for p in replicas):
            raise ValueError(f"only two or more replicas of one plain TP degree merge, got "
                             f"{[p.name() for p in replicas]}")
        ranks = tuple(r for p in replicas for r in p.ranks)
        return cls(tp=len(replicas) * t, merge_base=(len(replicas), t), rank_set=ranks)

    def split(self) -> list["Plan"]:
        """The replicas a merged plan was made of."""
        if self.merge_base is None:
            raise ValueError(f"plan {self.name()} is not a merged plan")
        return [self.base.replica(d) for d in range(self.merge_base[0])]

    @property
    def base(self) -> "Plan":
        """The plan whose weight shards and head layout this plan uses."""
        if self.merge_base is not None:
            return Plan(dp=self.merge_base[0], tp=self.merge_base[1], rank_set=self.rank_set)
        if self.shift_base is None:
            return self
        return Plan(self.dp, self.pp, *self.shift_base, rank_set=self.rank_set)

    def loaded_plan(self, rank: int) -> "Plan":
        """The plan `rank` loads its weights and sizes its KV pool under when it starts in
        this one: a merged plan's ranks load their replica's."""
        if self.merge_base is None:
            return self
        return self.base.replica(self.base.coords(rank).dp)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.rank_set if self.rank_set is not None else tuple(range(self.world_size))

    def on(self, ranks: tuple[int, ...]) -> "Plan":
        """The same plan over other ranks."""
        return replace(self, rank_set=tuple(ranks))

    def replica(self, dp_rank: int) -> "Plan":
        """One DP replica of this plan: the same degrees without DP, over its ranks."""
        members = tuple(r for r in self.ranks if self.coords(r).dp == dp_rank)
        return Plan(1, self.pp, self.sp, self.tp, self.shift_base, members)

    def output_rank(self) -> int:
        """The rank that reports a step's samples: last stage, first SP and TP position
        (of the first DP replica)."""
        return self.rank_of(Coords(0, self.pp - 1, 0, 0))

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.sp * self.tp

    @property
    def attn_degree(self) -> int:
        """Ranks over which one layer's attention heads are split (Ulysses SP x TP)."""
        return self.sp * self.tp

    def name(self) -> str:
        name = self.__dict__.get("_name")  # made once: every step names its plan
        if name is None:
            name = self._make_name()
            object.__setattr__(self, "_name", name)
        return name

    def _make_name(self) -> str:
        name = "x".join(f"{k}{getattr(self, k)}" for k in ("dp", "pp", "sp", "tp")
                        if getattr(self, k) > 1) or "single"
        name = f"shift-{name}" if self.shift_base else name
        name = f"merge{self.merge_base[0]}-{name}" if self.merge_base else name
        name = name if self.rank_set is None else f"{name}@{_ranks_text(self.rank_set)}"
        if self.shared_ffn is not None:
            name += f"+{self.shared_ffn[0]}/{_ranks_text(self.shared_ffn[1])}"
        return name

    @classmethod
    def parse(cls, text: str) -> "Plan":
        """The plan a name() names (not shift plans): "tp2", "dp2xsp2", "single", "tp2@2-3",
        "merge2-tp4@0-3" (two TP=2 replicas merged), "single@1+cas/0-1" (a SiDP replica)."""
        text, _, shared = text.partition("+")
        if shared:
            match = re.fullmatch(r"(was|cas)/([0-9.-]+)", shared)
            if match is None:
                raise ValueError(f"cannot read plan {text}+{shared}: a shared-FFN suffix is "
                                 "+was/<ranks> or +cas/<ranks>")
            return cls.parse(text).sharing_ffn(match.group(1), _parse_ranks(match.group(2)))
        degrees_text, _, ranks_text = text.partition("@")
        merge = re.fullmatch(r"merge([0-9]+)-(tp[0-9]+)", degrees_text)
        if merge is not None:
            w, tp = int(merge.group(1)), int(merge.group(2)[2:])
            if tp % w:
                raise ValueError(f"cannot read plan {text!r}: merging {w} replicas gives a TP "
                                 "degree that is a multiple of it")
            plan = cls(tp=tp, merge_base=(w, tp // w))
            return plan.on(_parse_ranks(ranks_text)) if ranks_text else plan
        degrees = {}
        if degrees_text != "single":
            for part in degrees_text.split("x"):
                match = re.fullmatch(r"(dp|pp|sp|tp)([0-9]+)", part)
                if match is None:
                    raise ValueError(f"cannot read plan {text!r}: parts are dp<N>, pp<N>, sp<N> "
                                     "or tp<N> joined by 'x', or 'single', then '@ranks'")
                degrees[match.group(1)] = int(match.group(2))
        plan = cls(**degrees)
        return plan.on(_parse_ranks(ranks_text)) if ranks_text else plan

    # ---- rank layout ---------------------------------------------------------
    def rank_of(self, c: Coords) -> int:
        return self.ranks[((c.dp * self.pp + c.pp) * self.sp + c.sp) * self.tp + c.tp]

    def coords(self, rank: int) -> Coords:
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} is not one of plan {self.name()}'s ranks")
        rank = self.ranks.index(rank)
        tp, rest = rank % self.tp, rank // self.tp
        sp, rest = rest % self.sp, rest // self.sp
        pp, dp = rest % self.pp, rest // self.pp
        return Coords(dp, pp, sp, tp)

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every group of this kind, as rank tuples in the group's own order."""
        if kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {kind!r}")
        seen: dict[tuple, None] = {}
        for rank in self.ranks:
            seen.setdefault(self.group_of(kind, rank), None)
        return list(seen)

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        if self.shift_base is not None or self.merge_base is not None:
            return self._narrowed_group_of(kind, rank)
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
        if kind == "ffn":
            # the replicas' ranks at this rank's TP position: they exchange FFN tokens
            if self.shared_ffn is None:
                return (rank,)
            sharing, size = self.shared_ffn[1], self.world_size
            return tuple(sharing[i + c.tp] for i in range(0, len(sharing), size))
        if kind == "dp_tp":
            # TP over the DP replicas' TP groups, each rank using its shard of its replica's
            # weights: position tp_rank * dp + dp_rank (a merge, Flying Serving).
            return tuple(self.rank_of(Coords(d, c.pp, c.sp, t))
                         for t in range(self.tp) for d in range(self.dp))
        degree = getattr(self, kind)
        return tuple(self.rank_of(vary[kind](i)) for i in range(degree))

    def _narrowed_group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """Groups of a shift or merged plan: TP over the base's SP_TP or DP_TP group."""
        base, outer = self.base, "sp_tp" if self.shift_base is not None else "dp_tp"
        if kind in ("tp", outer):
            return base.group_of(outer, rank)
        if kind in ("sp", "sp_tp", "dp_tp") or (kind == "dp" and self.merge_base):
            return (rank,)
        return base.group_of(kind, rank)

    def narrowing(self, rank: int) -> tuple[int, int] | None:
        """(factor, position) when this plan has `rank` use a 1/factor slice (the position-th)
        of the shard it loaded: the shift plan (factor sp) and merged plans (factor w)."""
        if self.shift_base is not None:
            return self.base.sp, self.base.coords(rank).sp
        if self.merge_base is not None:
            return self.merge_base[0], self.base.coords(rank).dp
        return None

    def ep_group_of(self, rank: int) -> tuple[int, ...]:
        """Ranks that split the experts under expert parallelism: the base plan's SP_TP group,
        so the shift plan keeps its base plan's experts (a merged plan: the replica's TP)."""
        return self.base.group_of("sp_tp", rank)

    def vocab_group_of(self, rank: int) -> tuple[int, ...]:
        """Ranks that split the vocabulary (embedding, LM head): the base plan's TP group."""
        return self.base.group_of("tp", rank)

    # ---- what each rank holds ------------------------------------------------
    def head_block(self, rank: int) -> int:
        """Index of this rank's block of attention heads (of attn_degree blocks)."""
        c = self.base.coords(rank)
        if self.merge_base is not None:
            return c.tp * self.base.dp + c.dp
        return c.tp * self.base.sp + c.sp

    def stage_layers(self, num_layers: int, pp_rank: int) -> range:
        """Layers of one pipeline stage: as even as possible, earlier stages one more."""
        if num_layers < self.pp:
            raise ValueError(f"{num_layers} layers cannot fill {self.pp} pipeline stages")
        base, extra = divmod(num_layers, self.pp)
        start = pp_rank * base + min(pp_rank, extra)
        return range(start, start + base + (pp_rank < extra))

    def check_model(self, num_heads: int, num_kv_heads: int, num_layers: int,
                    intermediate_size: int | None = None, experts: "ExpertShape | None" = None
                    ) -> None:
        """Start-up check that the model can be split this way; names valid degrees."""
        if intermediate_size is not None and intermediate_size % self.tp:
            raise ValueError(f"the MLP width {intermediate_size} cannot be split over tp = {self.tp}")
        if experts is not None:
            experts.check(self)
        if self.shared_ffn is not None:
            self._check_shared_ffn_model(intermediate_size, experts)
        degree = self.attn_degree
        valid = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        if num_heads % degree:
            raise ValueError(f"{num_heads} attention heads cannot be split over sp*tp = {degree} "
                             f"ranks; valid sp*tp degrees: {valid}")
        if num_kv_heads % degree and degree % num_kv_heads:
            raise ValueError(f"{num_kv_heads} KV heads cannot be split or replicated over sp*tp = "
                             f"{degree} ranks; use a divisor or a multiple of {num_kv_heads}")
        self.stage_layers(num_layers, 0)

    def _check_shared_ffn_model(self, intermediate_size: int | None,
                                experts: "ExpertShape | None") -> None:
        slices = len(self.shared_ffn[1])
        if experts is not None:
            raise ValueError("shared FFN weights (SiDP) are built for dense models; a mixture "
                             "of experts is served with expert parallelism (--moe-parallel ep)")
        if intermediate_size is not None and intermediate_size % slices:
            raise ValueError(f"the MLP width {intermediate_size} cannot be split into {slices} "
                             f"owned slices (data_parallel_size x tp); valid totals: "
                             f"{_divisors(intermediate_size)}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ExpertShape:
    """A mixture-of-experts model's expert sizes and how its plan splits them ("tp": each
    expert's intermediate dim over TP; "ep": whole experts over the base plan's SP x TP)."""
    num_experts: int
    top_k: int
    intermediate_size: int
    moe_parallel: str = "tp"

    def check(self, plan: Plan) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok = {self.top_k} must be in 1..{self.num_experts} "
                             "(the number of experts)")
        if self.moe_parallel == "ep":
            degree = plan.base.attn_degree
            if self.num_experts % degree:
                raise ValueError(f"{self.num_experts} experts cannot be split over the sp*tp = "
                                 f"{degree} ranks of expert parallelism; valid sp*tp degrees: "
                                 f"{_divisors(self.num_experts)} (or --moe-parallel tp)")
        elif self.intermediate_size % plan.tp:
            raise ValueError(f"the experts' intermediate size {self.intermediate_size} cannot be "
                             f"split over tp = {plan.tp}; valid tp degrees: "
                             f"{_divisors(self.intermediate_size)} (or --moe-parallel ep)")


def _ranks_text(ranks: tuple[int, ...]) -> str:
    contiguous = ranks == tuple(range(ranks[0], ranks[0] + len(ranks)))
    if contiguous and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ".".join(str(r) for r in ranks)


def _parse_ranks(text: str) -> tuple[int, ...]:
    if "-" in text:
        first, last = (int(x) for x in text.split("-"))
        return tuple(range(first, last + 1))
    return tuple(int(x) for x in text.split("."))


def describe(plan: Plan, num_layers: int | None = None, num_heads: int | None = None,
             num_kv_heads: int | None = None) -> str:
    """A table of every rank's coordinates and holdings, then every group."""
    lines = [f"plan {plan.name()}: dp={plan.dp} pp={plan.pp} sp={plan.sp} tp={plan.tp} "
             f"({plan.world_size} rank{'s' if plan.world_size > 1 else ''})"]
    for rank in plan.ranks:
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
