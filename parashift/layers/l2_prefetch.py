"""Which weight bytes are pulled into L2 where in a decode step (the kernel:
kernels/l2_prefetch.py), and the points in the decoder's blocks that launch those prefetches
right after their GEMMs.

A decoder layer names its GEMMs in the order a step runs them (`l2_prefetch_order` on its
class: (short name, linear layer's path)); over the model's layers that is one sequence of
weights. The block that runs a GEMM (attention: qkv, o; the dense MLP: gate_up, down) calls
`self.l2_prefetch.after(short name, its output)` right after it: a no-op unless
`attach_l2_prefetch` gave the block its points (not forward hooks: a module with one takes
torch's slower call path in every eager step, prefill too). After GEMM i, the budget of its short name
(PARASHIFT_L2_PREFETCH_MB) in bytes is pulled into L2 from the GEMMs after it: from where
the prefetches before stopped (the start of o's weight, then gate_up's; after down, the next
layer's qkv), at most two weights a launch. Only at decode's few rows (MAX_ROWS), where those
GEMMs stream their weights and the kernels between them (rotary, attention, the norms,
SiLU-and-mul) leave HBM nearly idle.

PARASHIFT_L2_PREFETCH: 1 (on) or 0 (off): the prefetch launched on a second stream forked
after the GEMM and joined after the step's last GEMM, so no kernel of the PDL chain waits
for it. Unset, the model's default (MODEL_DEFAULTS by config model_type, else 1). Read when
the model is built (where it resolves to off, or there is no CUDA device, no block gets
points) and again at each CUDA graph capture (a step's first GEMM reads it; a graph keeps
what its capture read), not at each call. PARASHIFT_L2_PREFETCH_MB (read likewise):
NAME:MB[/...] over the layer's short names, unnamed ones 0 (e.g. qkv:32/o:8/gate_up:8/down:8;
default o:8). Measured on an H200 (8B, one row; docs/benchmark_log.md): o:8
1.008x the engine's FP8 step (1.022x before the GEMV's evict-first hint), 1.004x bf16's.
(Placements in the PDL chain and the `lines` and `read` kinds measured slower and were
removed in session 51.) The prefetches move no arithmetic: a step's outputs are the same bits
with them and without."""
import os
from typing import Callable, NamedTuple

import torch

from parashift.engine_switches import switch
from parashift.kernels import use_triton

ENV = "PARASHIFT_L2_PREFETCH"
MB_ENV = "PARASHIFT_L2_PREFETCH_MB"
DEFAULT_MODE = "1"
# config model_type: PARASHIFT_L2_PREFETCH's default where a measurement differs from 1.
# Qwen3-30B-A3B b1 (H200): o:8 pulls the next layer's qkv in beside the experts' stream,
# 0.995x the step in session 46, 0.992x in session 47 (every round)
MODEL_DEFAULTS = {"qwen3_moe": "0"}
DEFAULT_MB = "o:8"  # gate_up's first 8 MB during the norm after o (8B FP8 b1: 1.008x)
MAX_ROWS = 4  # the GEMV's rows (kernels/fp8_gemv.py): above, GEMMs reuse tiles from L2 anyway
MAX_SPANS = 2  # weights a launch covers
ALIGN = 16  # bytes: a span's start and size (cp.async.bulk's unit)
MB = 1 << 20


class Planned(NamedTuple):
    """Bytes [first, first + count) of the weight of the GEMM `target` steps after this one."""
    target: int
    first: int
    count: int


def default_mode(model_type: str | None) -> str:
    return MODEL_DEFAULTS.get(model_type, DEFAULT_MODE)


def enabled(default: str = DEFAULT_MODE) -> bool:
    """PARASHIFT_L2_PREFETCH (unset: `default`)."""
    return switch(ENV, default)


def budget_text() -> str:
    return os.environ.get(MB_ENV, DEFAULT_MB)


def budgets(names: tuple[str, ...], text: str | None = None) -> dict[str, int]:
    """{short name: bytes prefetched after that GEMM} from `text` (PARASHIFT_L2_PREFETCH_MB's
    form; None: the switch's value); names it leaves out 0."""
    text = budget_text() if text is None else text
    result = dict.fromkeys(names, 0)
    for item in filter(None, text.split("/")):
        name, _, mb = item.partition(":")
        if name not in result or not mb.replace(".", "", 1).isdigit():
            raise ValueError(f"{MB_ENV}={text!r}: expected NAME:MB[/...], NAME among "
                             f"{list(names)}")
        result[name] = int(float(mb) * MB) // ALIGN * ALIGN
    return result


def plan(sizes: list[int], budgets: list[int]) -> list[list[Planned]]:
    """For each GEMM i of a step (its weight `sizes[i]` bytes), the spans prefetched after it:
    `budgets[i]` bytes from the GEMMs after it, each weight from where the spans before
    stopped, at most MAX_SPANS weights; sizes and budgets whole ALIGN units."""
    covered = [0] * len(sizes)
    spans = []
    for i, budget in enumerate(budgets):
        here = []
        for j in range(i + 1, len(sizes)):
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


def step_gemms(model: torch.nn.Module) -> list[tuple[str, str, torch.nn.Module]]:
    """(short name, the block that runs it, linear layer) of each GEMM the model's layers
    declare, in step order."""
    gemms = []
    for module in model.modules():
        for name, path in getattr(module, "l2_prefetch_order", ()):
            block, _, _ = path.rpartition(".")
            try:
                gemms.append((name, module.get_submodule(block), module.get_submodule(path)))
            except AttributeError:  # a mixture of experts' layer: no dense MLP
                continue
    return gemms


class StepPrefetches:
    """A step's GEMMs in order, the switches as read at construction (eager steps') or at the
    capture under way, and the plan per weight layout and budget (made at the first launch
    under each: weights are loaded by then)."""

    def __init__(self, names: list[str], weights: Callable[[], list[torch.Tensor | None]],
                 default: str = DEFAULT_MODE):
        self.names = names  # each GEMM's short name, in step order
        self.weights = weights  # each GEMM's weight under the active plan (None: left out)
        self.default = default  # PARASHIFT_L2_PREFETCH where unset
        self.built = enabled(default), budget_text()  # the switches at construction
        budgets(tuple(dict.fromkeys(names)), self.built[1])  # a bad budget is an error now
        self.current = self.built  # this step's, set at its first GEMM
        self._plans: dict = {}
        self._side: torch.cuda.Stream | None = None  # the side stream, made at first use
        self._forked = False  # a side prefetch launched since the last join

    def after(self, index: int, output: torch.Tensor) -> None:
        """GEMM `index` of the step gave `output` (at most MAX_ROWS rows): its prefetch."""
        if not use_triton(output):
            return
        if index == 0:
            self.current = ((enabled(self.default), budget_text())
                            if torch.cuda.is_current_stream_capturing() else self.built)
        on, text = self.current
        if on:
            self.launch(index, text)

    def launch(self, index: int, text: str) -> None:
        """Launches the prefetch planned after GEMM `index` of the step under budget `text` on
        the side stream; the step's last GEMM joins it."""
        from parashift.kernels import l2_prefetch, pdl
        spans = self.spans_after(index, text)
        if spans:
            main = torch.cuda.current_stream()
            self._side = self._side or torch.cuda.Stream(main.device)
            self._side.wait_stream(main)
            with torch.cuda.stream(self._side), pdl.suspended():
                l2_prefetch.prefetch(spans)
            self._forked = True
        if index == len(self.names) - 1 and self._forked:
            torch.cuda.current_stream().wait_stream(self._side)
            self._forked = False

    def spans_after(self, index: int, text: str) -> list:
        """The kernel's spans planned after GEMM `index` of the step under budget `text`."""
        from parashift.kernels import l2_prefetch
        weights, planned = self._plan(text)
        return [l2_prefetch.Span(weights[index + p.target], p.first, p.count)
                for p in planned[index]]

    def _plan(self, text: str) -> tuple[list, list[list[Planned]]]:
        from parashift.context import get_context
        key = get_context().weights, text
        if key not in self._plans:
            weights = self.weights()
            allotted = budgets(tuple(dict.fromkeys(self.names)), text)
            sizes = [0 if w is None else w.numel() * w.element_size() // ALIGN * ALIGN
                     for w in weights]
            self._plans[key] = weights, plan(sizes, [allotted[n] for n in self.names])
        return self._plans[key]


class BlockPrefetches:
    """A block's points: its GEMMs' short names and their indices in the step."""

    def __init__(self, steps: StepPrefetches, indices: dict[str, int]):
        self.steps = steps
        self.indices = indices

    def after(self, name: str, output: torch.Tensor) -> None:
        if output.numel() <= MAX_ROWS * output.shape[-1]:
            self.steps.after(self.indices[name], output)


class NoPrefetches:
    """A block's points where nothing is prefetched (the blocks' default)."""

    def after(self, name: str, output: torch.Tensor) -> None:
        pass


NO_PREFETCHES = NoPrefetches()


def attach_l2_prefetch(model: torch.nn.Module) -> int:
    """Gives each block running a declared GEMM its points, where a CUDA device exists and
    PARASHIFT_L2_PREFETCH (unset: the model's default) is 1 (a bad value is an error here);
    returns how many GEMMs got one."""
    default = default_mode(getattr(getattr(model, "config", None), "model_type", None))
    if not torch.cuda.is_available() or not enabled(default):
        return 0
    gemms = step_gemms(model)
    steps = StepPrefetches([name for name, _, _ in gemms],
                           lambda: [weight_of(layer) for _, _, layer in gemms], default)
    indices: dict[torch.nn.Module, dict[str, int]] = {}
    for index, (name, block, _) in enumerate(gemms):
        indices.setdefault(block, {})[name] = index
    for block, names in indices.items():
        block.l2_prefetch = BlockPrefetches(steps, names)
    return len(gemms)
