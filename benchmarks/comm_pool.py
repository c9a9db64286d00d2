"""Start-up time and host memory of the communicator pool, one process per rank.

Usage: python3 benchmarks/comm_pool.py --world 4 --plans sp2xtp2 dp2xtp2   (gloo on the CPU)
       python3 benchmarks/comm_pool.py --world 2 --backend nccl --plans tp2 (GPUs)"""
import argparse
import os
import resource
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parashift.parallel.comm_pool import CommunicatorPool
from parashift.parallel.plan import Plan


def parse_plan(text: str) -> Plan:
    degrees = {part[:2]: int(part[2:]) for part in text.split("x")}
    return Plan(**degrees)


def run(rank: int, world: int, port: int, backend: str, plans: list[str]) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pool = CommunicatorPool(rank, world, [parse_plan(p) for p in plans], backend)
    for ranks in list(pool._groups):  # NCCL communicators are made on first use
        if rank in ranks:
            t = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
            dist.all_reduce(t, group=pool._groups[ranks])
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    if rank == 0:
        print(f"world {world} {backend} plans {plans}: {pool.num_groups} groups, "
              f"{pool.startup_seconds * 1e3:.1f} ms to create, host RSS +{grown / 1024:.1f} MiB "
              f"on rank 0 after first use", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--plans", nargs="+", default=["sp2xtp2"])
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args.world, port, args.backend, args.plans), nprocs=args.world)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
