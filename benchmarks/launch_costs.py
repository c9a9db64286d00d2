"""Host time of single calls on a decode step's launch path, alone in a hot loop (no engine):
the step inputs of 256 plain decodes through the staging ring on the GPU and on the CPU, the
ring's reserve and send, the head's GEMM, the argmax, small copies and events; then numpy
writes into pinned against pageable memory. One GPU. Usage: python3 benchmarks/launch_costs.py
[--rows 256] [--after-graph] [--cold]. (Figures inside the engine are higher: its caches
are cold between calls; --cold measures by how much.) --after-graph: only the head's GEMM
launched right after a CUDA graph's replay, against alone, for graphs of 200 to 2,000
kernels (the median of 20 calls, each from an idle device), and the replay itself."""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from parashift.uploads import StagingRing, current_stream
from parashift.worker.step_chunks import DecodeChunks
from parashift.worker.step_inputs import build_step_inputs


def timed(label: str, fn, calls: int = 300) -> None:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    print(f"{label:44s} {spent / calls * 1e6:8.1f} us")


def launch_path(n: int, device: torch.device) -> None:
    rows, starts = list(range(n)), [500 + i % 17 for i in range(n)]
    tables = np.random.randint(0, 1000, (1024, 300)).astype(np.int32)
    ring, cpu_ring = StagingRing(device), StagingRing(torch.device("cpu"))
    into = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    def decodes():  # made in each call, as the rank's apply makes them (ids, params unread)
        return DecodeChunks([None] * n, rows, starts, [None] * n)
    timed(f"build_step_inputs {n}, ring on the GPU", lambda: build_step_inputs(
        decodes(), tables, 16, device, pad_to=n, pad_seqs=n, staging=ring, into=into))
    timed(f"build_step_inputs {n}, ring on the CPU", lambda: build_step_inputs(
        decodes(), tables, 16, torch.device("cpu"), pad_to=n, pad_seqs=n, staging=cpu_ring))
    shapes = [((n,), torch.int64)] * 3 + [((n + 1,), torch.int32), ((n,), torch.int32),
                                          ((n, 40), torch.int32)]
    timed("ring.reserve + send (6 arrays)", lambda: (ring.reserve(shapes, into), ring.send()))
    hidden = torch.randn(n, 4096, device=device, dtype=torch.bfloat16)
    head = torch.randn(128256, 4096, device=device, dtype=torch.bfloat16)
    logits = F.linear(hidden, head)
    tokens = torch.zeros(n, dtype=torch.int64, device=device)
    pinned = torch.empty(1024, dtype=torch.int64, pin_memory=True)
    event = torch.cuda.Event()
    event.record()
    timed(f"F.linear {n}x4096 @ 128256x4096", lambda: F.linear(hidden, head))
    timed(f"argmax of {n} rows", lambda: logits.argmax(dim=-1))
    timed(f"clone int64[{n}]", tokens.clone)
    timed("copy to pinned host memory", lambda: pinned[:n].copy_(tokens, non_blocking=True))
    timed("Event() and record", lambda: torch.cuda.Event().record(current_stream(device)))
    timed("synchronize a passed event", event.synchronize)
    timed(f"device copy_ of int64[{n}]", lambda: tokens[:n].copy_(tokens))


def pinned_writes(n: int) -> None:
    tables = np.random.randint(0, 1000, (1024, 300)).astype(np.int32)
    source = tables[:n, :40].copy()
    pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True).numpy().view(np.int32)
    pageable = np.empty(1 << 18, np.int32)
    for name, buffer in (("pinned", pinned), ("pageable", pageable)):
        view = buffer[:n * 40].reshape(n, 40)
        timed(f"{name}: table rows gathered into {n}x40",
              lambda: view.__setitem__(slice(None), tables[np.arange(n), :40]))
        timed(f"{name}: copyto {n}x40", lambda: np.copyto(view, source))
        timed(f"{name}: 10 fills of 256", lambda: [
            buffer.__setitem__(slice(i * 256, i * 256 + 256), i) for i in range(10)])
        timed(f"{name}: cumsum into", lambda: np.cumsum(source[:, 0], out=buffer[:n]))


def median_host_us(fn, before=None, calls: int = 20) -> float:
    """Median host time of fn(), each call from an idle device, after before() if given."""
    spent = []
    for _ in range(calls):
        torch.cuda.synchronize()
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return sorted(spent)[calls // 2] * 1e6


def after_graph(rows: int) -> None:
    """The head's GEMM launched alone and right after a graph replay: the replay returns
    before the driver has submitted the graph's kernels, and the next launch waits."""
    device = torch.device("cuda")
    head = torch.randn(128256, 4096, device=device, dtype=torch.bfloat16)
    x = torch.randn(rows, 4096, device=device, dtype=torch.bfloat16)
    print(f"head GEMM of {rows} rows, alone: {median_host_us(lambda: F.linear(x, head)):.1f} us")
    work = torch.randn(256, 4096, device=device, dtype=torch.bfloat16)
    for kernels in (200, 600, 1200, 2000):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                work.mul_(1.0001)
        after = median_host_us(lambda: F.linear(x, head), graph.replay)
        print(f"graph of {kernels} kernels: replay {median_host_us(graph.replay):.1f} us, "
              f"head GEMM after it {after:.1f} us")


def cold_calls(n: int) -> None:
    """Single calls of the step's launch path in a hot loop, right after a wait on the
    device (a ~10 ms kernel, as a step's result), after an idle sleep of 10 ms, and after
    a pass over 64 MB and 20,000 dicts: the median of 300 of each, in µs."""
    device = torch.device("cuda")
    stream = current_stream(device)
    rows, starts = list(range(n)), [500 + i % 17 for i in range(n)]
    tables = np.random.randint(0, 1000, (1024, 300)).astype(np.int32)
    ring, cpu_ring = StagingRing(device), StagingRing(torch.device("cpu"))
    into = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    host = torch.empty(1 << 16, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    junk, big = [dict(a=i) for i in range(20000)], np.zeros(8 << 20)

    def device_wait():
        torch.cuda._sleep(10_000_000)  # clock cycles: several milliseconds
        event = torch.cuda.Event()
        event.record(stream)
        event.synchronize()
    waits = {"hot": None, "after a device wait": device_wait,
             "after 10 ms asleep": lambda: time.sleep(0.01),
             "after a pass over 64 MB": lambda: (big.sum(), sum(map(len, junk)))}
    calls = {
        f"build_step_inputs {n}, ring on the GPU": lambda: build_step_inputs(
            DecodeChunks([None] * n, rows, starts, [None] * n), tables, 16, device,
            pad_to=n, pad_seqs=n, staging=ring, into=into),
        f"build_step_inputs {n}, ring on the CPU": lambda: build_step_inputs(
            DecodeChunks([None] * n, rows, starts, [None] * n), tables, 16,
            torch.device("cpu"), pad_to=n, pad_seqs=n, staging=cpu_ring),
        "a tensor's slice": lambda: host[:40000],
        "copy_ of 40 kB to the device": lambda: dev[:40000].copy_(host[:40000],
                                                                  non_blocking=True),
        f"numpy max of {n}": lambda: tables[0, :n].max(),
    }
    print(f"{'call':44s}" + "".join(f"{name:>26s}" for name in waits))
    for label, fn in calls.items():
        figures = []
        for before in waits.values():
            spent = []
            for _ in range(2000 if before is None else 300):
                if before is not None:
                    before()
                start = time.perf_counter()
                fn()
                spent.append(time.perf_counter() - start)
            figures.append(sorted(spent)[len(spent) // 2] * 1e6)
        print(f"{label:44s}" + "".join(f"{f:26.1f}" for f in figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--after-graph", action="store_true",
                        help="only the head's GEMM after a graph replay (after_graph)")
    parser.add_argument("--cold", action="store_true",
                        help="only single calls hot and after waits (cold_calls)")
    args = parser.parse_args()
    if args.cold:
        cold_calls(args.rows)
        return
    if args.after_graph:
        after_graph(args.rows)
        return
    print("numpy", np.__version__, "torch", torch.__version__)
    launch_path(args.rows, torch.device("cuda"))
    pinned_writes(args.rows)


if __name__ == "__main__":
    main()
