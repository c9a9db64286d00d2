"""Which weight bytes are pulled into L2 where in a decode step (the kernel:
kernels/l2_prefetch.py), and the hooks that launch those prefetches after a model's GEMMs.

A decoder layer names its GEMMs in the order a step runs them (`l2_prefetch_order` on its
class: (short name, linear layer's path)); over the model's layers that is one sequence of
weights. After GEMM i, the budget of its short name (PARASHIFT_L2_PREFETCH_MB) in bytes is
pulled into L2 from the GEMMs after it: from where the prefetches before stopped (the start
of o's weight, then gate_up's; after down, the next layer's qkv), at most two weights a
launch. Only at decode's few rows (MAX_ROWS), where those GEMMs stream their weights and the
kernels between them (rotary, attention, the norms, SiLU-and-mul) leave HBM nearly idle.

PARASHIFT_L2_PREFETCH: 0 (off), 1 (DEFAULT_ON), or [side:]KIND. KIND: bulk (one
`cp.async.bulk.prefetch.L2` a lane), lines (a `prefetch.global.L2` a line) or read (a load a
32-byte sector, their max & 0 stored to a sink word: sure to land in L2, but the kernel
lasts until it has);
side: launched on a second stream forked after the GEMM and joined after the step's last
GEMM, so no kernel of the PDL chain waits for it (else a node of the chain). Read at each
GEMM's call, so a CUDA graph keeps what its capture read; the hooks exist only where it was
not 0 when the model was built (on a CUDA device). PARASHIFT_L2_PREFETCH_MB:
NAME:MB[@TARGET][/...] over the layer's short names, unnamed ones 0 (e.g.
qkv:32/o:8/gate_up:8/down:8; default o:8); @TARGET: that GEMM's bytes first, the GEMMs
between passed over (qkv:16@gate_up: during attention gate_up's weight, not o's). Measured on an H200 (8B FP8, one row; docs/benchmark_log.md): side:bulk o:8 1.022x
the engine's step, every placement in the chain slower; on by default (1). The
prefetches move no arithmetic: a step's outputs are the same bits with them and without."""
import os
from typing import Callable, NamedTuple

import torch

from parashift.kernels import use_triton

ENV = "PARASHIFT_L2_PREFETCH"
MB_ENV = "PARASHIFT_L2_PREFETCH_MB"
KINDS = ("bulk", "lines", "read")
DEFAULT_ON = ("side", "bulk")  # PARASHIFT_L2_PREFETCH=1: the best measured
DEFAULT_MODE = "1"
DEFAULT_MB = "o:8"  # gate_up's first 8 MB during the norm after o (8B FP8 b1: 1.022x)
MAX_ROWS = 4  # the GEMV's rows (kernels/fp8_gemv.py): above, GEMMs reuse tiles from L2 anyway
MAX_SPANS = 2  # weights a launch covers
ALIGN = 16  # bytes: a span's start and size (cp.async.bulk's unit)
MB = 1 << 20


class Planned(NamedTuple):
    """Bytes [first, first + count) of the weight of the GEMM `target` steps after this one."""
    target: int
    first: int
    count: int


def mode() -> tuple[str, str] | None:
    """(where: "chain" or "side", kind) from PARASHIFT_L2_PREFETCH, None where off."""
    value = os.environ.get(ENV, DEFAULT_MODE)
    if value in ("0", "1"):
        return None if value == "0" else DEFAULT_ON
    where, _, kind = value.rpartition(":")
    if where not in ("", "side") or kind not in KINDS:
        raise ValueError(f"{ENV}={value!r}: expected 0, 1 or [side:]KIND, KIND one of "
                         f"{list(KINDS)}")
    return where or "chain", kind


def _allotments(names: tuple[str, ...]) -> dict[str, tuple[int, str | None]]:
    """{short name: (bytes prefetched after that GEMM, the GEMM they start at or None: the
    next)} from PARASHIFT_L2_PREFETCH_MB; names it leaves out 0."""
    text = os.environ.get(MB_ENV, DEFAULT_MB)
    result = dict.fromkeys(names, (0, None))
    for item in filter(None, text.split("/")):
        name, _, amount = item.partition(":")
        mb, _, target = amount.partition("@")
        if (name not in result or not mb.replace(".", "", 1).isdigit()
                or target and target not in names):
            raise ValueError(f"{MB_ENV}={text!r}: expected NAME:MB[@TARGET][/...], NAME and "
                             f"TARGET among {list(names)}")
        result[name] = int(float(mb) * MB) // ALIGN * ALIGN, target or None
    return result


def budgets(names: tuple[str, ...]) -> dict[str, int]:
    """{short name: bytes prefetched after that GEMM} from PARASHIFT_L2_PREFETCH_MB."""
    return {name: count for name, (count, _) in _allotments(names).items()}


def skips(names: list[str]) -> list[int]:
    """For each GEMM of a step, the GEMMs after it its prefetch passes over (@TARGET: up to
    that name's next GEMM; past the step's end: all of them)."""
    targets = {name: target for name, (_, target) in _allotments(tuple(dict.fromkeys(names)))
               .items()}
    return [0 if targets[name] is None else
            next((k for k in range(len(names) - i - 1) if names[i + 1 + k] == targets[name]),
                 len(names)) for i, name in enumerate(names)]


def plan(sizes: list[int], budgets: list[int], skips: list[int] | None = None
         ) -> list[list[Planned]]:
    """For each GEMM i of a step (its weight `sizes[i]` bytes), the spans prefetched after it:
    `budgets[i]` bytes from the GEMMs after it (past the first `skips[i]` of them), each
    weight from where the spans before stopped, at most MAX_SPANS weights; sizes and budgets
    whole ALIGN units."""
    covered = [0] * len(sizes)
    spans = []
    for i, budget in enumerate(budgets):
        here = []
        for j in range(i + 1 + (skips[i] if skips else 0), len(sizes)):
            if budget <= 0 or len(here) == MAX_SPANS:
                break
            count = min(budget, sizes[j] - covered[j]) // ALIGN * ALIGN
            if count > 0:
                here.append(Planned(j - i, covered[j], count))
                covered[j] += count
                budget -= count
        spans.append(here)
    return spans


def weight_of(layer) -> torch.Tensor | None:
    """The one contiguous weight the linear layer runs under the active plan, else None."""
    parts = layer._active_parts()
    if len(parts) != 1 or not parts[0].weight.is_contiguous():
        return None
    return parts[0].weight


def step_gemms(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(short name, linear layer) of each GEMM the model's layers declare, in step order."""
    gemms = []
    for module in model.modules():
        for name, path in getattr(module, "l2_prefetch_order", ()):
            try:
                gemms.append((name, module.get_submodule(path)))
            except AttributeError:  # a mixture of experts' layer: no dense MLP
                continue
    return gemms


class StepPrefetches:
    """The hooks' shared state: a step's GEMMs in order, and the plan per weight layout and
    budget (made at the first call under each: weights are loaded by then)."""

    def __init__(self, names: list[str], weights: Callable[[], list[torch.Tensor | None]]):
        self.names = names  # each GEMM's short name, in step order
        self.weights = weights  # each GEMM's weight under the active plan (None: left out)
        self._plans: dict = {}
        self._side: torch.cuda.Stream | None = None  # the side stream, made at first use
        self._forked = False  # a side prefetch launched since the last join

    def after(self, index: int, mode: tuple[str, str], after_wait: bool = True,
              chunk: int | None = None, max_programs: int | None = None) -> None:
        """Launches the prefetch planned after GEMM `index` of the step, as `mode` says
        ((where, kind): on the side stream, the step's last GEMM joins it); after_wait,
        chunk and max_programs: the kernel's (kernels/l2_prefetch.py), for benchmarks."""
        from parashift.kernels import l2_prefetch, pdl
        where, kind = mode
        weights, planned = self._plan()
        spans = [l2_prefetch.Span(weights[index + p.target], p.first, p.count)
                 for p in planned[index]]
        if where == "chain":
            l2_prefetch.prefetch(spans, kind, after_wait, chunk, max_programs)
        elif spans:
            main = torch.cuda.current_stream()
            self._side = self._side or torch.cuda.Stream(main.device)
            self._side.wait_stream(main)
            with torch.cuda.stream(self._side), pdl.suspended():
                l2_prefetch.prefetch(spans, kind, after_wait, chunk, max_programs)
            self._forked = True
        if index == len(self.names) - 1 and self._forked:
            torch.cuda.current_stream().wait_stream(self._side)
            self._forked = False

    def _plan(self) -> tuple[list, list[list[Planned]]]:
        from parashift.context import get_context
        key = (get_context().weights, os.environ.get(MB_ENV, DEFAULT_MB))
        if key not in self._plans:
            weights = self.weights()
            allotted = budgets(tuple(dict.fromkeys(self.names)))
            sizes = [0 if w is None else w.numel() * w.element_size() // ALIGN * ALIGN
                     for w in weights]
            self._plans[key] = weights, plan(sizes, [allotted[n] for n in self.names],
                                             skips(self.names))
        return self._plans[key]

    def hook(self, index: int) -> Callable:
        def after_gemm(module, args, output):
            how = mode()
            if (how is not None and isinstance(output, torch.Tensor) and use_triton(output)
                    and output.numel() // output.shape[-1] <= MAX_ROWS):
                self.after(index, how)
        return after_gemm


def register_l2_prefetch(model: torch.nn.Module) -> int:
    """Hooks each declared GEMM of the model to launch its prefetch after it, where a CUDA
    device exists and PARASHIFT_L2_PREFETCH is not 0 (it is read again at each call, so a
    benchmark may capture graphs under other values); returns how many were hooked. At 0,
    no hook: a module with one takes torch's slower call path."""
    if not torch.cuda.is_available() or mode() is None:  # a bad value is an error now
        return 0
    gemms = step_gemms(model)
    prefetches = StepPrefetches([name for name, _ in gemms],
                                lambda: [weight_of(layer) for _, layer in gemms])
    for index, (_, layer) in enumerate(gemms):
        layer.register_forward_hook(prefetches.hook(index))
    return len(gemms)
