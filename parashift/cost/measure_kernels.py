"""Timed points of the engine's own kernels for `parashift profile`: GEMMs, paged attention
through the engine's attention backend, the fused residual-add RMSNorm, the sampler's argmax.
Each returns (bytes or FLOPs, seconds) points in the step model's own terms (cost/step.py),
for the fits of cost/fit.py.

Device time on CUDA: CUDA events around repeated calls, after warm-up; a kernel of less than
`GRAPH_BELOW_S` is captured `repeats` times in a CUDA graph and replayed, so that its launch
(host) time is left out, as in the engine's graphs. On the CPU: the least wall time (a
loaded host's other work only ever adds to it). What a step reads once (weights, KV) is
rotated over copies of at least `rotation_bytes` in all, so repeated calls do not find it
in the L2 cache; activations are not (a step's stay there too)."""
import statistics
import time

import torch

GRAPH_BELOW_S = 200e-6
ROUNDS = 3
MAX_COPIES = 64


def rotation_bytes(device: torch.device) -> int:
    """Past an H200's 50 MB of L2; none on a CPU (its sizes are for tests, kept quick)."""
    return (256 << 20) if device.type == "cuda" else 0


def rotated(timer: "Timer", make, nbytes: int):
    """A function that hands out copies of what `make()` returns in turn, enough of them to
    pass the cache, and a timer that calls it at least once per copy."""
    count = max(1, min(MAX_COPIES, -(-rotation_bytes(timer.device) // max(nbytes, 1))))
    copies = [make() for _ in range(count)]
    turn = iter(range(1 << 62))
    return (lambda: copies[next(turn) % count]), Timer(timer.device, max(timer.repeats, count))


class Timer:
    def __init__(self, device: torch.device, repeats: int):
        self.device, self.repeats = device, repeats

    def __call__(self, fn) -> float:
        """Seconds of device time of one call of `fn`."""
        if self.device.type != "cuda":
            return self._wall(fn)
        for _ in range(2):
            fn()
        torch.cuda.synchronize(self.device)
        eager = self._events(lambda: [fn() for _ in range(self.repeats)]) / self.repeats
        if eager >= GRAPH_BELOW_S:
            return eager
        try:
            return self._graph(fn)
        except Exception:  # noqa: BLE001  a kernel that cannot be captured: its eager time
            return eager

    def _wall(self, fn) -> float:
        fn()
        samples = []
        for _ in range(max(self.repeats, 3)):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return min(samples)

    def _events(self, run) -> float:
        times = []
        for _ in range(ROUNDS):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize(self.device)
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def _graph(self, fn) -> float:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.repeats):
                fn()
        graph.replay()
        seconds = self._events(graph.replay) / self.repeats
        del graph
        return seconds


def gemm_points(timer: Timer, shapes, rows_list, dtype) -> list[tuple[int, int, int, float]]:
    """(rows, n, k, seconds) of x[rows, k] @ w[k, n] (the engine's F.linear) per shape."""
    out = []
    size = torch.tensor([], dtype=dtype).element_size()
    for n, k in shapes:
        weight, timed = rotated(timer, lambda: torch.randn(n, k, dtype=dtype,
                                                           device=timer.device), n * k * size)
        for rows in rows_list:
            x = torch.randn(rows, k, dtype=dtype, device=timer.device)
            out.append((rows, n, k, timed(lambda: torch.nn.functional.linear(x, weight()))))
    return out


def fp8_gemm_points(timer: Timer, shapes, rows_list, dtype) -> list[tuple[int, int, int, float]]:
    """(rows, n, k, seconds) of the engine's FP8-weight GEMM (kernels/fp8_gemm.py: E4M3
    weights, one scale a row) per shape."""
    from parashift.kernels import fp8_gemm
    from parashift.quantization.fp8 import quantize_rows
    out = []
    for n, k in shapes:
        weight, timed = rotated(timer, lambda: quantize_rows(
            torch.randn(n, k, dtype=dtype, device=timer.device)), n * k)
        for rows in rows_list:
            x = torch.randn(rows, k, dtype=dtype, device=timer.device)
            out.append((rows, n, k, timed(lambda: fp8_gemm.linear(x, *weight(), None))))
    return out


def paged_step(device, dtype, heads: int, kv_heads: int, head_dim: int,
               q_lens: list[int], seq_lens: list[int], block_size: int = 16,
               shuffled: bool = False):
    """q, the KV pools and metadata of one step over a paged pool (its blocks in a random
    order where `shuffled`)."""
    from parashift.attention.metadata import AttentionMetadata
    blocks = [-(-s // block_size) for s in seq_lens]
    order = (torch.randperm(sum(blocks)) if shuffled else torch.arange(sum(blocks))).int()
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n]
        used += n
    pool = (used, block_size, kv_heads, head_dim)
    k_cache = torch.randn(pool, dtype=dtype, device=device)
    v_cache = torch.randn(pool, dtype=dtype, device=device)
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device), query_start_loc_cpu=starts, seq_lens_cpu=list(seq_lens),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=block_size)
    q = torch.randn(starts[-1], heads, head_dim, dtype=dtype, device=device)
    return q, k_cache, v_cache, meta


def attention_seconds(timer: Timer, dtype, heads: int, kv_heads: int, head_dim: int,
                      q_lens: list[int], seq_lens: list[int]) -> float:
    """One `attend` of the engine's attention backend for this device."""
    from parashift.attention.backend import get_backend
    backend = get_backend("auto", timer.device)
    size = torch.tensor([], dtype=dtype).element_size()
    kv_bytes = 2 * sum(seq_lens) * kv_heads * head_dim * size
    step, timed = rotated(timer, lambda: paged_step(timer.device, dtype, heads, kv_heads,
                                                    head_dim, q_lens, seq_lens), kv_bytes)
    return timed(lambda: backend.attend(*step(), head_dim ** -0.5))


def norm_points(timer: Timer, hidden: int, rows_list, dtype) -> list[tuple[int, float]]:
    """(bytes, seconds) of the engine's residual-add RMSNorm (reads x and the residual,
    writes both)."""
    from parashift.layers.layernorm import RMSNorm
    norm = RMSNorm(hidden).to(device=timer.device, dtype=dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    out = []
    for rows in rows_list:
        x = torch.randn(rows, hidden, dtype=dtype, device=timer.device)
        residual = torch.randn_like(x)
        out.append((4 * rows * hidden * size, timer(lambda: norm(x, residual))))
    return out


def sampler_points(timer: Timer, vocab: int, rows_list) -> list[tuple[int, float]]:
    """(rows, seconds) of the greedy sampler's argmax over float32 logits."""
    from parashift.layers.sampler import Sampler
    out = []
    for rows in rows_list:
        logits = torch.randn(rows, vocab, dtype=torch.float32, device=timer.device)
        out.append((rows, timer(lambda: Sampler.argmax(logits))))
    return out


def eager_launch_s(device: torch.device, hidden: int, dtype, calls: int = 200) -> float:
    """Host seconds to launch one kernel of an eager layer (linear, norm, activation, add),
    the device's queue left to absorb them."""
    from parashift.layers.layernorm import RMSNorm
    x = torch.randn(1, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, hidden, dtype=dtype, device=device)
    norm = RMSNorm(hidden).to(device=device, dtype=dtype)
    ops = (lambda: torch.nn.functional.linear(x, w), lambda: norm(x),
           lambda: torch.nn.functional.silu(x), lambda: x + x)
    for op in ops:
        op()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        for op in ops:
            op()
    seconds = (time.perf_counter() - start) / (calls * len(ops))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seconds
