"""Deterministic mode's row-parallel sum under TP=2, by part, beside the default's GEMM and
all-reduce: where the deterministic TP=2 decode step's extra time goes (issue 22).

Usage (two CUDA GPUs): PYTHONPATH=. python3 benchmarks/det_tp_sum.py [--rows 1 64 256 4096]
One process per GPU on NCCL, with the engine's symmetric-memory all-reduce. The 8B shape's
row-parallel projections (o: K 4096, down: K 14336; N 4096), each rank holding half of K in
8 canonical chunks. Every part is captured `--repeats` times in one CUDA graph and replayed;
prints one JSON line per (projection, rows) from rank 0, ms per call:
  default        bf16 GEMM + the one-shot all-reduce (the default mode's projection)
  det_gather     the deterministic projection, halves all-gathered (PARASHIFT_DETERMINISTIC_TP_SUM=gather)
  det_all_reduce the same, halves added by the one-shot all-reduce (=all_reduce, no pair
                 exchange)
  det_pair       the same, each half stored by its GEMM here and in the peer's memory, then
                 one barrier and the add (=all_reduce with the pair exchange: the engine's)
  terms          the rank's fp32 half alone (its GEMM)
  gather         the all-gather of the halves alone (into one tensor)
  gather_list    the same into a list, then torch.cat (GroupHandle.all_gather before)
  add            adding the gathered halves (add_terms)
  all_reduce     the one-shot all-reduce of the fp32 halves alone
  add_pair       adding the bias's zero and rounding its result (add_pair)"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PROJECTIONS = [(4096, 4096, "o"), (4096, 14336, "down")]
CHUNKS = 8


def graph_ms(fn, repeats: int) -> float:
    """ms per call of `fn`, captured `repeats` times in one graph, best of 5 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return round(min(times), 4)


def with_mode(mode: str, fn):
    def run():
        os.environ["PARASHIFT_DETERMINISTIC_TP_SUM"] = mode
        return fn()
    return run


def gather_list(group, term):
    parts = [torch.empty_like(term) for _ in range(2)]
    dist.all_gather(parts, term, group=group)
    return torch.cat(parts)


def worker(rank: int, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    from parashift.deterministic.reduction import (add_pair, add_terms, rank_terms,
                                                   row_parallel_linear, term_layout)
    from parashift.parallel.fast_all_reduce import FastAllReduce
    from parashift.parallel.pair_exchange import PairExchange
    from parashift.parallel.state import GroupHandle
    world = dist.group.WORLD
    fast = FastAllReduce(world, torch.device("cuda"))
    tp = GroupHandle((0, 1), rank, group=world, fast=fast)
    paired = GroupHandle((0, 1), rank, group=world, fast=fast,
                         pair=PairExchange(world, torch.device("cuda")))
    assert paired.pair.available, "no symmetric memory"
    layout = term_layout(CHUNKS, 2)
    torch.manual_seed(rank)
    for n, k, name in PROJECTIONS:
        w = torch.randn(n, k // 2, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in args.rows:
            x = torch.randn(m, k // 2, device="cuda", dtype=torch.bfloat16)
            term = rank_terms(x, w, layout, rank)
            gathered = tp.all_gather(term.unsqueeze(0), dim=0)
            parts = dict(
                default=lambda: tp.all_reduce(torch.nn.functional.linear(x, w)),
                det_gather=with_mode("gather", lambda: row_parallel_linear(x, w, None, tp,
                                                                           CHUNKS)),
                det_all_reduce=with_mode("all_reduce", lambda: row_parallel_linear(
                    x, w, None, tp, CHUNKS)),
                # one step token for the whole run: the parts are apart (synchronized)
                det_pair=with_mode("all_reduce", lambda: row_parallel_linear(
                    x, w, None, paired, CHUNKS, step=paired)),
                terms=lambda: rank_terms(x, w, layout, rank),
                gather=lambda: tp.all_gather(term.unsqueeze(0), dim=0),
                gather_list=lambda: gather_list(world, term),
                add=lambda: add_terms(gathered, None, torch.bfloat16, layout),
                all_reduce=lambda: tp.all_reduce(term[0]),
                add_pair=lambda: add_pair(term[0], None, torch.bfloat16))
            row = dict(projection=name, rows=m, n=n, k_per_rank=k // 2)
            expected = with_mode("gather", lambda: row_parallel_linear(x, w, None, tp, CHUNKS))()
            row["pair_bits_equal"] = bool(torch.equal(
                with_mode("all_reduce", lambda: row_parallel_linear(x, w, None, paired,
                                                                    CHUNKS, step=paired))(),
                expected))
            for label, fn in parts.items():
                row[label] = graph_ms(fn, args.repeats)
            if rank == 0:
                print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256, 1024, 4096])
    p.add_argument("--repeats", type=int, default=20)
    mp.spawn(worker, args=(p.parse_args(),), nprocs=2)


if __name__ == "__main__":
    main()
