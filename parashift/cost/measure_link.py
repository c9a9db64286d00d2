"""The link profile of this machine's GPUs: every collective the step model uses, timed
through torch.distributed (NCCL) over all local GPUs, eagerly and inside a CUDA graph, at
sizes from 8 KiB to 256 MiB per rank."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parashift.cost.profile import LinkProfile
from parashift.parallel.topology import peer_access_disabled

SIZES = [8 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20, 64 << 20, 256 << 20]
CALLS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ops(rank: int, world: int, nbytes: int):
    n = max(world, nbytes // 2 // world * world)
    x = torch.ones(n, dtype=torch.bfloat16, device=f"cuda:{rank}")
    out = torch.empty_like(x)
    gathered = torch.empty(n * world, dtype=x.dtype, device=x.device)
    peer = (rank + 1) % world if rank % 2 == 0 else (rank - 1) % world

    def send_recv():
        if rank % 2 == 0:
            dist.send(x, peer)
        else:
            dist.recv(out, peer)
    return {"all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_into_tensor(gathered, x),
            "all_to_all": lambda: dist.all_to_all_single(out, x),
            "send_recv": send_recv}


def _time(fn, graph: bool) -> float:
    fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(CALLS):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(CALLS):
                fn()
    run()
    torch.cuda.synchronize()
    dist.barrier()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / CALLS


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    points: dict = {}
    for nbytes in SIZES:
        for name, fn in _ops(rank, world, nbytes).items():
            for mode in ("eager", "graph") if name != "send_recv" else ("eager",):
                seconds = _time(fn, mode == "graph")
                points.setdefault(name, {}).setdefault(mode, []).append([nbytes, seconds])
    if rank == 0:
        results.put(points)
    dist.barrier()
    dist.destroy_process_group()


def measure_link(commit: str = "") -> LinkProfile:
    world = torch.cuda.device_count()
    if world < 2:
        raise ValueError("a link profile needs two or more local GPUs")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_worker, args=(world, _free_port(), results), nprocs=world,
                       join=True, start_method="spawn")
    points = results.get()
    points["peer_copy"] = points["send_recv"]
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    pinned = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    src.copy_(pinned)
    end.record()
    torch.cuda.synchronize()
    to_device = (1 << 30) / (start.elapsed_time(end) / 1e3)
    notes = {"kv_tier_bytes_per_s": "the pinned host-to-device rate"}
    pcie_like = peer_access_disabled()
    if pcie_like:
        notes["NCCL_P2P_DISABLE=1"] = (
            "every collective timed through NCCL's host path; the engine's one-shot all-reduce "
            "(to 4 MiB) still reads peer memory: take those points from an NVLink profile "
            "(benchmarks/cost_profiles_pcie.py)")
    return LinkProfile(device=torch.cuda.get_device_name(0), ranks=world, collectives=points,
                       source=f"measured by `parashift profile` at commit {commit or 'unknown'}",
                       host_to_device_bytes_per_s=to_device, kv_tier_bytes_per_s=to_device,
                       link="pcie-like" if pcie_like else "nvlink", notes=notes)
