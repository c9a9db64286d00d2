"""Timing GEMM candidates the way decode runs them: back to back in a CUDA graph, each call
on another copy of the weight so that no copy stays in L2 (decode reads every weight from
HBM once a step). Candidates are timed in turn, ROUNDS times, and each gets its median: a
drift of the clock or a stray slow replay moves every candidate alike or none. An L2 flush
between calls (triton's do_bench) instead leaves the flush's dirty lines to be written back
during the timed call, and its events' overhead is a large part of a few-µs kernel."""
import logging
import math
import statistics
from typing import Callable, Hashable

import torch
import triton.testing

logger = logging.getLogger(__name__)

ROUNDS = 7
CALLS_PER_REPLAY = 16  # calls per graph: the events' overhead shared by many kernels
MAX_COPIES = 8


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


def replayed_timings_ms(candidates: dict[Hashable, Callable[[int], object]], copies: int
                        ) -> dict[Hashable, float]:
    """Median ms per call of each candidate; candidate(i) runs on weight copy i. A candidate
    that fails to compile, run or be captured is left out (logged)."""
    calls = [i % copies for i in range(max(CALLS_PER_REPLAY, copies))]
    pool = torch.cuda.graph_pool_handle()  # one for all: the outputs are never read
    graphs = {}
    for key, run in candidates.items():
        try:
            graphs[key] = _graph([lambda i=i, run=run: run(i) for i in calls], pool)
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            logger.warning("GEMM candidate %s failed: %s", key, exc)
    for graph in graphs.values():
        graph.replay()  # the first replay uploads the graph
    samples: dict[Hashable, list[float]] = {key: [] for key in graphs}
    for _ in range(ROUNDS):
        for key, graph in graphs.items():
            samples[key].append(_replay_ms(graph, len(calls)))
    return {key: statistics.median(times) for key, times in samples.items()}


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
