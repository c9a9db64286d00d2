"""Timing GEMM candidates the way decode runs them: back to back in a CUDA graph, each call
on another copy of the weight so that no copy stays in L2 (decode reads every weight from
HBM once a step). Candidates are timed in turn, ROUNDS times, and each gets its median: a
drift of the clock or a stray slow replay moves every candidate alike or none. An L2 flush
between calls (triton's do_bench) instead leaves the flush's dirty lines to be written back
during the timed call, and its events' overhead is a large part of a few-µs kernel.

PARASHIFT_GEMM_TIMING picks how the calls run: "chain" (the default since 2026-11-30) as a
decode step runs them, with PDL as the engine launches (kernels/pdl.py) and each call after
a small kernel that writes its input (as a norm or an activation writes a projection's
input), so a Triton kernel is timed with the overlap PDL gives it in decode (cuBLAS has
none), a config that issues its first weight loads before the PDL wait (fp8_gemv.py's
AHEAD) with what that gains, and one kernel's calls do not overlap as no step's do; "graph"
with PDL suspended, one candidate's calls back to back (the default before; on an H200 it
put the 8B's bf16 gate_up [28672, 4096] at one row on cuBLAS: 4.34 ms a step, where the
chain's and the flushed timing's GEMVs ran 4.26 and 4.22 in another call); "flushed" one
call at a time with L2 flushed between calls (triton's do_bench; the bf16 skinny GEMM's
timing before 2026-11-30, where GEMV configs of Qwen3-30B-A3B's attention projections timed
23-27 us that run 6.5-7.9 in a graph)."""
import contextlib
import logging
import math
import os
import statistics
from typing import Callable, Hashable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from parashift.kernels import pdl

logger = logging.getLogger(__name__)

TIMING_ENV = "PARASHIFT_GEMM_TIMING"
TIMING_MODES = ("chain", "graph", "flushed")
INPUT_BLOCK = 1024  # elements of the input a program of the input-writing kernel copies

ROUNDS = 7
CALLS_PER_REPLAY = 16  # calls per graph: the events' overhead shared by many kernels
MAX_COPIES = 8
# `steady_choice`: a candidate displaces one listed before it only where faster by more than
# this share of its time, or by more than either's round-to-round spread where that is wider.
# 2% (session 48) kept bf16 gate_up's slower one-row GEMV on an H200: the 8B bf16 b1 step
# 1.013x and the MoE b1 step 1.010x slower than the fastest pick (session 49; raw s49_x2)
STEADY_MARGIN = 0.005


class Timings(dict):
    """Median ms per call by candidate (the dict), with each candidate's round-to-round
    spread (`spread`: the interquartile range of its rounds over their median; a candidate
    without one counts as 0)."""

    def __init__(self, medians: dict, spread: dict | None = None):
        super().__init__(medians)
        self.spread = dict(spread or {})


def relative_spread(samples: list[float]) -> float:
    """The interquartile range of the samples over their median (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    low, _, high = statistics.quantiles(samples, n=4, method="inclusive")
    return (high - low) / statistics.median(samples)


def margin_between(timings: dict, a: Hashable, b: Hashable, least: float) -> float:
    """The share of a time by which one of a, b must beat the other to count: `least`, or
    either one's spread where wider; a negative `least` (the challenger taken even where
    slower by that much: a test forcing a kernel) as it is."""
    if least < 0:
        return least
    spread = getattr(timings, "spread", {})
    return max(least, spread.get(a, 0.0), spread.get(b, 0.0))


def beats(timings: dict, challenger: Hashable, kept: Hashable, least: float) -> bool:
    """Whether `challenger` is faster than `kept` by more than `margin_between` them."""
    margin = margin_between(timings, challenger, kept, least)
    return timings[challenger] < (1 - margin) * timings[kept]


def steady_choice(timings: dict, library_margin: float, what: str = "GEMM",
                  label: Callable[[object], str] = str) -> Hashable | None:
    """The choice every GEMM chooser makes from its timings (None: the library's GEMM or the
    unfused pair, the reference): among the candidates that beat the reference by
    1 - library_margin (or the spreads where wider), the first in the table's order (the
    timings' order) that the fastest of them does not beat (`beats`, STEADY_MARGIN), so that
    a near tie keeps the same config from one engine start to the next; None where no
    candidate beats the reference. Logs what was chosen and by how much."""
    reference = timings.get(None)
    configs = [c for c in timings if c is not None and
               (reference is None or beats(timings, c, None, 1 - library_margin))]
    fastest = min(configs, key=timings.__getitem__, default=None)
    chosen = next((c for c in configs if not beats(timings, fastest, c, STEADY_MARGIN)), None)
    if chosen is not None:
        logger.info("%s: %s %.2f µs; fastest %s %.2f µs (margin %.1f%%); reference %s µs",
                    what, label(chosen), 1e3 * timings[chosen], label(fastest),
                    1e3 * timings[fastest],
                    100 * margin_between(timings, fastest, chosen, STEADY_MARGIN),
                    "-" if reference is None else f"{1e3 * reference:.2f}")
    elif reference is not None:
        logger.info("%s: %s %.2f µs (no candidate beat it)", what, label(None), 1e3 * reference)
    return chosen


def timing_mode() -> str:
    """PARASHIFT_GEMM_TIMING: "chain" (the default), "graph" or "flushed"."""
    mode = os.environ.get(TIMING_ENV, "chain")
    if mode not in TIMING_MODES:
        raise ValueError(f"{TIMING_ENV}={mode!r}: expected one of {list(TIMING_MODES)}")
    return mode


def chained() -> bool:
    """Whether PARASHIFT_GEMM_TIMING asks for the decode chain ("chain")."""
    return timing_mode() == "chain"


def flushed() -> bool:
    """Whether PARASHIFT_GEMM_TIMING asks for calls with L2 flushed ("flushed")."""
    return timing_mode() == "flushed"


def timing_launches(chain: bool | None = None) -> contextlib.AbstractContextManager:
    """The context a GEMM times its candidates in: PDL as the engine launches in the chain
    (`chain`, by default as PARASHIFT_GEMM_TIMING asks), else suspended (the choice then the
    same with PDL off and on)."""
    return contextlib.nullcontext() if (chained() if chain is None else chain) \
        else pdl.suspended()


def chosen_once(choices: dict, key: Hashable, choose: Callable[[], object]) -> object:
    """choices[key], made by `choose()` (timing the candidates, under `timing_launches`) at
    the key's first call outside a CUDA graph capture (the graphs' warm-up runs come first);
    None (the library GEMM) during a capture before that."""
    if key not in choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        with timing_launches():
            choices[key] = choose()
    return choices[key]


def timed_input(x: torch.Tensor, chain: bool | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """(the input the candidates read, (source, that input) for `replayed_timings_ms` to
    rewrite before each call, or None): a copy of x in the chain (`chain`, by default as
    PARASHIFT_GEMM_TIMING asks), else x itself."""
    if not (chained() if chain is None else chain):
        return x, None
    source = x.contiguous()
    written = source.clone()
    return written, (source, written)


@triton.jit
def _write_input_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl.start(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(src_ptr + offs, mask=offs < n)
    pdl.inputs_read(USE_PDL)
    tl.store(dst_ptr + offs, values, mask=offs < n)


def write_input(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (contiguous) = src by a PDL-aware kernel: the kernel before a timed GEMM call."""
    n = dst.numel()
    _write_input_kernel[(triton.cdiv(n, INPUT_BLOCK),)](src, dst, n, BLOCK=INPUT_BLOCK,
                                                        **pdl.launch_options(dst.device))


def weight_copies(weight: torch.Tensor) -> list[torch.Tensor]:
    """The weight and copies of it with its strides, together at least twice L2's size."""
    l2 = getattr(torch.cuda.get_device_properties(weight.device), "L2_cache_size", 64 << 20)
    nbytes = weight.shape[0] * weight.stride(0) * weight.element_size()
    count = max(2, min(MAX_COPIES, math.ceil(2 * l2 / max(nbytes, 1))))
    copies = [weight]
    for _ in range(count - 1):
        buffer = torch.empty(weight.shape[0], weight.stride(0), dtype=weight.dtype,
                             device=weight.device)
        copies.append(buffer[:, :weight.shape[1]].copy_(weight))
    return copies


def _graph(calls: list[Callable[[], object]], pool) -> torch.cuda.CUDAGraph:
    """The calls captured on a side stream (torch.cuda.graph's context would also collect
    garbage and empty the allocator's cache for each of hundreds of candidates)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for call in calls:  # compiles and warms up outside the capture
            call()
        stream.synchronize()
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            for call in calls:
                call()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _chained_call(run: Callable[[int], object], i: int,
                  chain: tuple[torch.Tensor, torch.Tensor] | None) -> Callable[[], object]:
    def call():
        if chain is not None:
            write_input(*chain)
        return run(i)
    return call


def replayed_timings_ms(candidates: dict[Hashable, Callable[[int], object]], copies: int,
                        chain: tuple[torch.Tensor, torch.Tensor] | None = None
                        ) -> Timings:
    """Median ms per call of each candidate, with its rounds' spread (`Timings`);
    candidate(i) runs on weight copy i, after `write_input(*chain)` where chain is given
    (`timed_input`: the time counts that kernel too, alike for every candidate). A candidate
    that fails to compile, run or be captured is left out (logged)."""
    calls = [i % copies for i in range(max(CALLS_PER_REPLAY, copies))]
    pool = torch.cuda.graph_pool_handle()  # one for all: the outputs are never read
    graphs = {}
    for key, run in candidates.items():
        try:
            graphs[key] = _graph([_chained_call(run, i, chain) for i in calls], pool)
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            logger.warning("GEMM candidate %s failed: %s", key, exc)
    for graph in graphs.values():
        graph.replay()  # the first replay uploads the graph
    samples: dict[Hashable, list[float]] = {key: [] for key in graphs}
    for _ in range(ROUNDS):
        for key, graph in graphs.items():
            samples[key].append(_replay_ms(graph, len(calls)))
    return Timings({key: statistics.median(times) for key, times in samples.items()},
                   {key: relative_spread(times) for key, times in samples.items()})


def against_library_ms(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       kernel: Callable, configs) -> dict[Hashable, float]:
    """`replayed_timings_ms` of F.linear (key None) and of kernel(x, weight, bias, config)
    for each config, over copies of the weight, in the chain where PARASHIFT_GEMM_TIMING
    asks (`timed_input`)."""
    weights = weight_copies(weight)
    xin, chain = timed_input(x)
    runs = {None: lambda i: F.linear(xin, weights[i], bias)}
    runs.update({c: lambda i, c=c: kernel(xin, weights[i], bias, c) for c in configs})
    return replayed_timings_ms(runs, len(weights), chain)


def flushed_timings_ms(candidates: dict[Hashable, Callable[[], object]]
                       ) -> dict[Hashable, float]:
    """Median ms per call with L2 flushed between calls (triton's do_bench), for where a
    graph cannot be captured."""
    timings = {}
    for key, run in candidates.items():
        try:
            timings[key] = triton.testing.do_bench(run, warmup=5, rep=50, return_mode="median")
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            logger.warning("GEMM candidate %s failed: %s", key, exc)
    return timings
