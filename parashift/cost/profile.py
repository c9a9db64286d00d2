"""Measured costs as data: a compute profile (one device's kernels) and a link profile
(collectives and copies between a node's devices), each a JSON file with a schema version,
the device, and where its numbers came from (a command at a commit, or a section of
docs/benchmark_log.md they were derived from).

A kernel's time is a roofline fit: the longer of bytes / (peak bandwidth * bw_eff) and
flops / (peak matrix rate * flops_eff), plus `overlap` times the shorter (near the ridge a
kernel does not hide all of its loads behind its math), plus launch. A collective's time is read off its
measured points (bytes -> seconds), piecewise linear in log-log space between them; below
the smallest point it costs the smallest point's time (latency), above the largest the
largest point's bandwidth carries on."""
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

SCHEMA_VERSION = 1
COLLECTIVES = ("all_reduce", "all_gather", "all_to_all", "send_recv", "peer_copy")
MODES = ("graph", "eager")


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{owner}: {name} must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class Curve:
    """Seconds by bytes from measured points, interpolated in log-log space."""
    points: tuple[tuple[float, float], ...]

    def __post_init__(self):
        pts = tuple(sorted((float(b), float(s)) for b, s in self.points))
        if not pts or any(b <= 0 or s <= 0 for b, s in pts):
            raise ValueError(f"a curve needs points of bytes > 0 and seconds > 0, got {self.points}")
        if len({b for b, _ in pts}) != len(pts):
            raise ValueError(f"a curve has two points at one size: {pts}")
        object.__setattr__(self, "points", pts)

    def __call__(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1] * nbytes / pts[-1][0]
        for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
            if nbytes <= b1:
                f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
                return math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0)))
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Roofline:
    """A kernel family's fit: efficiencies against the device's peaks, a fixed cost, and the
    share of the shorter of its bytes and FLOPs times that the longer does not hide."""
    bw_eff: float
    flops_eff: float
    launch_s: float
    overlap: float = 0.0

    def __post_init__(self):
        _positive("roofline", bw_eff=self.bw_eff, flops_eff=self.flops_eff)
        if not self.launch_s >= 0:
            raise ValueError(f"roofline launch_s must be >= 0, got {self.launch_s}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"roofline overlap must be in [0, 1], got {self.overlap}")


@dataclass(frozen=True)
class ComputeProfile:
    """One device's rates and kernel fits. Kernel families: gemm (dense projections and the
    LM head), decode_attention (reads each sequence's KV), prefill_attention (causal FLOPs),
    elementwise (norms, rotary, activation, KV writes: bytes per token), moe (expert GEMMs:
    weights of the experts the batch touches), sampler (per sampled row)."""
    device: str
    source: str
    hbm_bytes_per_s: float
    matmul_flops: float
    memory_bytes: float            # one device's memory in all
    memory_utilization: float      # the share the engine takes (--gpu-memory-utilization)
    activation_bytes: float        # what a step's activations and graphs keep from the KV pool
    gemm: Roofline
    decode_attention: Roofline
    prefill_attention: Roofline
    elementwise: Roofline
    moe: Roofline
    sampler_s: float               # per step
    sampler_row_s: float           # per sampled row
    host_step_s: float             # host time a step adds where it is not overlapped (graphs)
    eager_launch_s: float          # host time to launch one kernel without a graph
    kernels_per_layer: int         # kernels an eager layer launches
    host_to_device_bytes_per_s: float
    # kernels an eager layer launches beyond kernels_per_layer under SP (the exchanges and
    # their packing) and under TP (the all-reduces)
    sp_kernels_per_layer: int = 0
    tp_kernels_per_layer: int = 2
    host_seq_s: float = 0.0        # host time a step adds per sequence it runs
    # kernels an eager MoE layer launches beyond kernels_per_layer (routing, the pair sort,
    # the grouped GEMMs and their sum)
    moe_kernels_per_layer: int = 0
    # kernels (host work in their measure) an eager SiDP CaS layer adds per replica sharing
    # its FFN: the exchanges, the hooks' row packing, the peers' waits on each other's launches
    cas_kernels_per_peer: int = 0
    # how a graph step's host terms combine with its device time: False: they add (the part
    # a step does not overlap, as fitted to logged steps); True: they are the host's whole
    # work, which async scheduling overlaps with the device (max), as `parashift profile`
    # measures them
    host_overlapped: bool = False
    # a lone request's host work around its step, which no other step overlaps (admission,
    # scheduling, inputs, output: a prompt timed from add_request to its token), per request
    # and per prompt token; 0 where not measured (StepModel.lone_step_s)
    lone_host_s: float = 0.0
    lone_host_token_s: float = 0.0
    # FP8-weight GEMMs (kernels/fp8_gemm.py): bytes of E4M3 weights, FLOPs at fp8_matmul_flops
    fp8_gemm: Roofline | None = None
    fp8_matmul_flops: float = 0.0
    # dense GEMMs timed by shape, in the model's dtype: (n, k, rows, seconds) of x[rows, k] @
    # w[k, n]; a GEMM of a timed (n, k) is read off its timings (StepModel._gemm), the gemm
    # roofline prices every other shape
    gemm_timed: tuple = ()
    schema_version: int = SCHEMA_VERSION
    kind: str = "compute"
    notes: dict = field(default_factory=dict)

    def __post_init__(self):
        _positive(f"compute profile {self.device}", hbm_bytes_per_s=self.hbm_bytes_per_s,
                  matmul_flops=self.matmul_flops, memory_bytes=self.memory_bytes,
                  host_to_device_bytes_per_s=self.host_to_device_bytes_per_s)
        if not (self.lone_host_s >= 0 and self.lone_host_token_s >= 0):
            raise ValueError(f"lone_host_s and lone_host_token_s must be >= 0, got "
                             f"{self.lone_host_s}, {self.lone_host_token_s}")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        object.__setattr__(self, "gemm_timed", _timed_points(self.gemm_timed))
        by_shape = {}
        for n, k, rows, seconds in sorted(self.gemm_timed):
            by_shape.setdefault((n, k), []).append((rows, seconds))
        object.__setattr__(self, "_gemm_by_shape", by_shape)  # not a field: not saved
        _check_header(self, "compute")

    def gemm_timings(self, n: int, k: int) -> list[tuple[int, float]]:
        """(rows, seconds) of the GEMMs of weight (n, k) timed, by rows; empty if none."""
        return self._gemm_by_shape.get((n, k), [])

    def roofline_s(self, fit: Roofline, nbytes: float, flops: float,
                   matmul_flops: float | None = None) -> float:
        by_bytes = nbytes / (self.hbm_bytes_per_s * fit.bw_eff)
        by_flops = flops / ((matmul_flops or self.matmul_flops) * fit.flops_eff)
        return (max(by_bytes, by_flops) + fit.overlap * min(by_bytes, by_flops)) + fit.launch_s

    def fp8_gemm_s(self, nbytes: float, flops: float) -> float:
        if self.fp8_gemm is None or not self.fp8_matmul_flops > 0:
            raise ValueError(f"compute profile of {self.device} has no FP8 GEMM fit "
                             "(fp8_gemm, fp8_matmul_flops): measure one with `parashift "
                             "profile` on a GPU with FP8")
        return self.roofline_s(self.fp8_gemm, nbytes, flops, self.fp8_matmul_flops)


@dataclass(frozen=True)
class LinkProfile:
    """Collectives over `ranks` devices of one node: seconds by bytes per rank (the tensor
    one rank holds before the call), measured inside CUDA graphs and eagerly; copies
    between the host and devices and to the CPU KV tier."""
    device: str
    source: str
    ranks: int
    collectives: dict              # name -> mode -> Curve
    host_to_device_bytes_per_s: float
    kv_tier_bytes_per_s: float
    link: str = "nvlink"
    schema_version: int = SCHEMA_VERSION
    kind: str = "link"
    notes: dict = field(default_factory=dict)

    def __post_init__(self):
        _check_header(self, "link")
        if not isinstance(self.ranks, int) or self.ranks < 2:
            raise ValueError(f"a link profile covers >= 2 ranks, got {self.ranks!r}")
        unknown = set(self.collectives) - set(COLLECTIVES)
        if unknown:
            raise ValueError(f"link profile: unknown collectives {sorted(unknown)}; "
                             f"known: {', '.join(COLLECTIVES)}")
        curves = {}
        for name, modes in self.collectives.items():
            if set(modes) - set(MODES) or not modes:
                raise ValueError(f"link profile {name}: modes must be among {MODES}, got {list(modes)}")
            curves[name] = {m: c if isinstance(c, Curve) else Curve(tuple(map(tuple, c)))
                            for m, c in modes.items()}
        object.__setattr__(self, "collectives", curves)

    def seconds(self, name: str, nbytes: float, ranks: int, graph: bool = True) -> float:
        """One call of collective `name` on `nbytes` per rank among `ranks` of this node's
        devices; a group smaller than the profile's scales by the ring's traffic."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        if name not in self.collectives:
            raise ValueError(f"link profile of {self.ranks} {self.device} has no {name}; "
                             f"it has {', '.join(self.collectives)}")
        modes = self.collectives[name]
        curve = modes.get("graph" if graph else "eager") or next(iter(modes.values()))
        scale = _ring_share(name, ranks) / _ring_share(name, self.ranks)
        return curve(nbytes * scale)


def _timed_points(points) -> tuple:
    """`gemm_timed` checked: (n, k, rows) integers >= 1, seconds > 0, each (n, k, rows) once."""
    out = []
    for point in points:
        point = tuple(point)
        if (len(point) != 4 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                   or not v > 0 for v in point)
                or any(v != int(v) for v in point[:3])):
            raise ValueError(f"gemm_timed: each entry is (n, k, rows, seconds), integers >= 1 "
                             f"and seconds > 0; got {point!r}")
        out.append((int(point[0]), int(point[1]), int(point[2]), float(point[3])))
    keys = [p[:3] for p in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f"gemm_timed: an (n, k, rows) timed twice in {keys}")
    return tuple(out)


def _ring_share(name: str, ranks: int) -> float:
    """The bytes one rank sends per byte it holds, in a ring (all-reduce 2(n-1)/n, gathers
    and all-to-all (n-1)/n, a point-to-point copy 1)."""
    if name in ("send_recv", "peer_copy"):
        return 1.0
    share = (ranks - 1) / ranks
    return 2 * share if name == "all_reduce" else share


def _check_header(profile, kind: str) -> None:
    if profile.schema_version != SCHEMA_VERSION:
        raise ValueError(f"{kind} profile schema_version {profile.schema_version}; this "
                         f"parashift reads {SCHEMA_VERSION}")
    if profile.kind != kind:
        raise ValueError(f"expected a {kind} profile, got kind {profile.kind!r}")
    if not profile.device or not profile.source:
        raise ValueError(f"a {kind} profile names its device and its source")


ROOFLINES = ("gemm", "decode_attention", "prefill_attention", "elementwise", "moe")


def compute_from_dict(doc: dict) -> ComputeProfile:
    known = {f.name for f in fields(ComputeProfile)}
    unknown = set(doc) - known
    if unknown:
        raise ValueError(f"compute profile: unknown fields {sorted(unknown)}")
    doc = dict(doc)
    for name in ROOFLINES:
        if name not in doc:
            raise ValueError(f"compute profile: no {name}")
        doc[name] = Roofline(**doc[name])
    if doc.get("fp8_gemm") is not None:
        doc["fp8_gemm"] = Roofline(**doc["fp8_gemm"])
    return ComputeProfile(**doc)


def link_from_dict(doc: dict) -> LinkProfile:
    known = {f.name for f in fields(LinkProfile)}
    unknown = set(doc) - known
    if unknown:
        raise ValueError(f"link profile: unknown fields {sorted(unknown)}")
    return LinkProfile(**doc)


def to_dict(profile) -> dict:
    doc = asdict(profile)
    if isinstance(profile, LinkProfile):
        doc["collectives"] = {name: {m: [list(p) for p in c.points] for m, c in modes.items()}
                              for name, modes in profile.collectives.items()}
    return doc


def load(path: str | Path):
    """A compute or link profile from its JSON file (its `kind` says which)."""
    doc = json.loads(Path(path).read_text())
    kind = doc.get("kind")
    if kind == "compute":
        return compute_from_dict(doc)
    if kind == "link":
        return link_from_dict(doc)
    raise ValueError(f"{path}: not a profile (kind {kind!r}; expected compute or link)")


def save(profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(profile), indent=1) + "\n")
