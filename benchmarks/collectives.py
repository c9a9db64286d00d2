"""All-reduce (NCCL vs the symmetric-memory fast path) and all_to_all_single latency on
2 GPUs, one process per GPU, eagerly and replayed from a CUDA graph of 20 calls.

Usage: python3 benchmarks/collectives.py --output coll.json"""
import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parashift.parallel.fast_all_reduce import FastAllReduce

WORLD = 2
ALL_REDUCE_BYTES = [8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20]
SP_TOKENS = [1, 4, 16, 64, 256, 1024, 4096]
SP_WIDTHS = (4096, 1024, 1024)  # q, k and v columns of the 8B shape (32, 8, 8 heads of 128)
CALLS_PER_GRAPH = 20


def time_eager(fn, iters: int) -> float:
    """Microseconds per call of `fn`, host launch overhead included."""
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def time_graph(fn, replays: int) -> float:
    """Microseconds per call of `fn`, CALLS_PER_GRAPH calls captured in one graph."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    return time_eager(graph.replay, replays) / CALLS_PER_GRAPH


def row(op: str, impl: str, nbytes: int, fn, iters: int) -> dict:
    dist.barrier()
    eager = time_eager(fn, iters)
    dist.barrier()
    graph = time_graph(fn, max(1, iters // CALLS_PER_GRAPH))
    return dict(op=op, impl=impl, bytes=nbytes, eager_us=round(eager, 2), graph_us=round(graph, 2))


def all_reduce_rows(fast: FastAllReduce, device: torch.device, iters: int) -> list[dict]:
    rows = []
    for nbytes in ALL_REDUCE_BYTES:
        x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
        rows.append(row("all_reduce", "nccl", nbytes, lambda: dist.all_reduce(x), iters))
        rows.append(row("all_reduce", "fast", nbytes, lambda: fast.all_reduce(x), iters))
    return rows


def all_to_all_rows(device: torch.device, iters: int) -> list[dict]:
    """The SP exchange: each rank holds its share of the tokens' q/k/v columns. `fused` is
    what Ulysses does (q, k and v packed in one all-to-all); `separate` is one each, the
    exchange before that fusion."""
    rows = []
    for tokens in SP_TOKENS:
        local = -(-tokens // WORLD)
        sends = [torch.randn(local * w, dtype=torch.bfloat16, device=device) for w in SP_WIDTHS]
        recvs = [torch.empty_like(s) for s in sends]
        packed = torch.cat(sends)
        packed_recv = torch.empty_like(packed)

        def separate():
            for recv, send in zip(recvs, sends):
                dist.all_to_all_single(recv, send)

        for impl, fn in (("fused", lambda: dist.all_to_all_single(packed_recv, packed)),
                         ("separate", separate)):
            rows.append(dict(tokens=tokens, **row("sp_qkv_all_to_all", impl, packed.nbytes, fn,
                                                   iters)))
    return rows


def run(rank: int, port: int, iters: int, output: str | None) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, device_id=device)
    fast = FastAllReduce(dist.group.WORLD, device)
    if not fast.available:
        raise RuntimeError("the fast all-reduce could not be set up (see the log)")
    rows = all_reduce_rows(fast, device, iters) + all_to_all_rows(device, iters)
    if rank == 0:
        text = json.dumps(dict(world=WORLD, device=torch.cuda.get_device_name(),
                               torch=torch.__version__, rows=rows), indent=1)
        print(text, flush=True)
        if output:
            with open(output, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output", default=None, help="write the JSON table here too")
    p.add_argument("--iters", type=int, default=200, help="timed eager calls per row")
    args = p.parse_args()
    if torch.cuda.device_count() < WORLD:
        raise SystemExit(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, args.iters, args.output), nprocs=WORLD)


if __name__ == "__main__":
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    main()
