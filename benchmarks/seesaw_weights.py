"""Seconds and bytes of Seesaw weight switches (parallel/seesaw_weights.py) on every rank of
one group, with the least arena: from peers (parallel/reshard_schedule.py, peer_reshard.py)
against the pinned host copies only, for a shape file's model under --prefill and --decode
plans. Random weights: the bytes are timed, not checked (tests/distributed/
test_seesaw_peer_weights.py checks them). One process per rank: GPUs over NCCL, or gloo
on CPUs for a smoke check. Prints JSON per mode and direction: each rank's bytes (all,
from peers, from host) and the slowest rank's seconds per switch (median of --switches).

Usage (from the repository root, two GPUs):
  PYTHONPATH=. python3 benchmarks/seesaw_weights.py --output seesaw-weights.json
Smoke check on a CPU:
  PYTHONPATH=. python3 benchmarks/seesaw_weights.py --device cpu --model <a tiny shape file>"""
import argparse
import json
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parashift.context import use_state
from parashift.loader.source import load_hf_config, resolve_model
from parashift.loader.weights import init_random_weights
from parashift.models.registry import model_class_for
from parashift.parallel.plan import Plan
from parashift.parallel.seesaw_weights import PeerGroup, WeightArena
from parashift.parallel.state import ParallelState
from parashift.worker.peer_weights import STAGING_BYTES, group_weights

MAX_MODEL_LEN = 4096


def checkpoint_shapes_of(hf_config) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor shapes, from Hugging Face's model on the meta device."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def build(hf_config, plan: Plan, rank: int, device, dtype) -> torch.nn.Module:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with use_state(ParallelState.unconnected(plan, rank)), torch.device(device):
            model = model_class_for(hf_config)(hf_config, MAX_MODEL_LEN)
    finally:
        torch.set_default_dtype(saved)
    init_random_weights(model)
    return model


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def time_switches(arena: WeightArena, plans: list[str], switches: int, device) -> dict:
    rows = {}
    for _ in range(switches):
        for new in (plans[1], plans[0]):
            _sync(device)
            start = time.perf_counter()
            moved = arena.prefetch(new)
            switch = arena.activate(new)
            seconds = time.perf_counter() - start
            row = rows.setdefault(f"to_{new}", {"seconds": []})
            row["seconds"].append(seconds)
            row.update(bytes=moved.bytes + switch.bytes,
                       peer_bytes=moved.peer_bytes + switch.peer_bytes,
                       host_bytes=moved.host_bytes + switch.host_bytes)
    return rows


def _rank(rank: int, port: int, args) -> None:
    world = Plan.parse(args.prefill).world_size
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist.all_reduce(torch.zeros(1, device=device))  # NCCL: the group's first op, every rank
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf_config = load_hf_config(resolve_model(args.model))
    plans = [Plan.parse(args.prefill), Plan.parse(args.decode)]
    names = [p.name() for p in plans]
    weights = group_weights(hf_config, checkpoint_shapes_of(hf_config), plans, dtype,
                            MAX_MODEL_LEN)
    results = {}
    for mode in ("peer", "host"):
        models = {p.name(): build(hf_config, p, rank, device, dtype) for p in plans}
        peers = PeerGroup(dist.group.WORLD, rank, weights, args.staging_mib * 2**20)
        arena = WeightArena(models, device, peers=peers if mode == "peer" else None)
        time_switches(arena, names, 1, device)  # warm-up
        results[mode] = time_switches(arena, names, args.switches, device)
        del arena, models
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        report(gathered, args)
    dist.destroy_process_group()


def report(per_rank: list[dict], args) -> None:
    out = {"model": args.model, "prefill": args.prefill, "decode": args.decode,
           "staging_mib": args.staging_mib, "device": args.device}
    for mode in per_rank[0]:
        for direction in per_rank[0][mode]:
            slowest = [max(r[mode][direction]["seconds"][i] for r in per_rank)
                       for i in range(args.switches)]
            out[f"{mode}_{direction}"] = {
                "seconds": statistics.median(slowest),
                **{what: [r[mode][direction][what] for r in per_rank]
                   for what in ("bytes", "peer_bytes", "host_bytes")}}
    text = json.dumps(out, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--prefill", default="pp2")
    p.add_argument("--decode", default="tp2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--switches", type=int, default=5)
    p.add_argument("--staging-mib", type=int, default=STAGING_BYTES // 2**20)
    p.add_argument("--output")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, args), nprocs=Plan.parse(args.prefill).world_size)


if __name__ == "__main__":
    main()
