"""GEMMs on the CPU through the route each weight shape runs fastest on this CPU: plain
`F.linear`, oneDNN on the weight reordered once at start-up into the blocked layout its
kernels read (what `F.linear` would pack again on every call; for any rows or for one),
or, in fp32 at one row, MKL's packed GEMM.

On a one-device CPU engine the linear layers and the LM head swap their `matmul` for a
`PackedLinear` of their weight, which takes, by the step's rows (a row bucket), the route
layers/cpu_gemm_choice.py timed fastest for that shape at start-up: the packed routes skip
the per-call packing that at decode's few rows is a large share of a GEMM, but which route
wins depends on the CPU (measured in docs/benchmark_log.md). A packed copy is a second copy
of the weight, so packed copies are made only where they fit in the host's available
memory. Any other weight (a narrowed layout, a dequantized copy) and any non-CPU input take
the plain GEMM."""
import logging

import torch
import torch.nn.functional as F
from torch import nn

from parashift.host_memory import mem_available_bytes
from parashift.layers.cpu_gemm_choice import (DEFAULT_ROUTE, ROW_BUCKETS, GemmChoice,
                                              bucket_of, choose_routes, pack, run_route)

logger = logging.getLogger(__name__)

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_reorder_linear_weight")


class PackedLinear:
    """`matmul(x, weight, bias)` running, for `source` itself unchanged since it was packed,
    the route `routes` names for the input's row bucket (layers/cpu_gemm_choice.py); any
    other weight runs `fallback`. By default every bucket takes oneDNN's packed GEMM."""

    def __init__(self, source: torch.Tensor, fallback, routes: dict[int, str] | None = None):
        self.source, self.fallback = source, fallback
        self.stamp = _stamp(source)
        self.routes = routes or dict.fromkeys(ROW_BUCKETS, DEFAULT_ROUTE)
        self.packed = {r: pack(r, source.detach()) for r in set(self.routes.values())}
        self._by_bucket = {bucket: self._runner(route) for bucket, route in self.routes.items()}

    @property
    def nbytes(self) -> int:
        """The packed copies' bytes (oneDNN's are opaque: counted as the weight's)."""
        return sum(0 if p is None else p.nbytes if route == "mkl" else self.source.nbytes
                   for route, p in self.packed.items())

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        if weight is not self.source or x.dtype != weight.dtype or x.is_cuda \
                or _stamp(weight) != self.stamp:
            return self.fallback(x, weight, bias)
        if x.dim() == 2:
            return self._by_bucket[bucket_of(x.shape[0])](x, bias)
        rows = x.reshape(-1, x.shape[-1])
        out = self._by_bucket[bucket_of(rows.shape[0])](rows, bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _runner(self, route: str):
        if route == "plain":
            return lambda x, bias: self.fallback(x, self.source, bias)
        packed = self.packed[route]
        return lambda x, bias: run_route(route, x, packed, self.source, bias)


def _stamp(weight: torch.Tensor) -> tuple[int, int]:
    """Changes when the weight's storage is replaced or written in place through it (not
    through `.data`: weights are packed after loading, and a one-device engine writes none
    after that)."""
    return weight.data_ptr(), weight._version


def packable_layers(model: nn.Module) -> list[nn.Module]:
    """The modules with a plain float `weight` on the CPU whose GEMMs go through their
    `matmul` attribute (the linear layers and the LM head)."""
    return [m for m in model.modules()
            if hasattr(m, "matmul") and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.device.type == "cpu" and m.weight.dtype in PACKED_DTYPES
            and m.weight.dim() == 2 and getattr(m, "weight_scale", None) is None]


def pack_cpu_weights(model: nn.Module) -> GemmChoice:
    """Gives the model's CPU GEMMs the route chosen for each (shape, row bucket) and the
    packed copies those routes read, where the copies fit in half the host's available
    memory (else every GEMM stays plain). Returns the choice (its `nbytes`: the packed
    copies' bytes, 0 where none was made)."""
    if not can_pack():
        return GemmChoice.plain("torch built without oneDNN")
    layers = packable_layers(model)
    choice = choose_routes([m.weight for m in layers])
    available = mem_available_bytes()
    for option in (choice, choice.all_default()):
        needed = sum({id(m.weight): option.packed_bytes(m.weight) for m in layers}.values())
        if available is None or needed <= available // 2:
            choice = option
            break
        logger.info("CPU GEMM routes %s: %.1f GiB of packed copies would not fit in half of "
                    "the %.1f GiB available", option.source, needed / 2**30, available / 2**30)
    else:
        return GemmChoice.plain("the packed copies would not fit in memory")
    nbytes = 0
    for module in layers:
        routes = choice.routes_of(module.weight)
        if set(routes.values()) != {"plain"}:
            module.matmul = PackedLinear(module.weight, F.linear, routes)
            nbytes += module.matmul.nbytes
    choice.nbytes = nbytes
    logger.info("CPU GEMM routes (%s): %s", choice.source, choice.describe())
    return choice


def unpack_cpu_weights(model: nn.Module) -> int:
    """Gives the packed layers their plain GEMM back (a before/after in one process);
    returns how many were packed."""
    layers = [m for m in model.modules() if isinstance(getattr(m, "matmul", None), PackedLinear)]
    for module in layers:
        module.matmul = module.matmul.fallback
    return len(layers)
