"""GB/s of moving KV between one rank's paged pool and the CPU KV tier (kv/tier_copy.py):
`gather` (pool -> tier, a seesaw move out) and `scatter` (tier -> pool, a move in) of
--num-requests requests of --tokens tokens each, for the slices one rank of a 2-GPU
Llama-3.1-8B plan holds (32 layers, 8 KV heads, head_dim 128, bf16):
  tp2: every layer x 4 of the 8 KV heads;   pp2: 16 of the layers x every head.
With the tier page-locked (cudaHostRegister, as the workers do) and not, printed as JSON.

Usage (one GPU, from the repository root; not yet run on a GPU, next session):
  PYTHONPATH=. python3 benchmarks/tier_copy.py --output tier-copy-h100.json
Smoke check on a CPU (seconds; a few small requests, no page-locking):
  PYTHONPATH=. python3 benchmarks/tier_copy.py --device cpu"""
import argparse
import json
import random
import time

import torch

from parashift.kv.cpu_tier import CpuKVTier, TierShape
from parashift.kv.tier_allocator import TierSlot
from parashift.kv.tier_copy import KVSlice, gather, scatter, wait_for_copies

SHAPE = TierShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
SLICES = {"tp2": KVSlice(range(0, 32), range(0, 4)), "pp2": KVSlice(range(0, 16), range(0, 8))}


def make_pool(kv_slice: KVSlice, num_blocks: int, block_size: int, device) -> torch.Tensor:
    shape = (len(kv_slice.layers), num_blocks, block_size, len(kv_slice.heads), SHAPE.head_dim)
    return torch.randn(shape, device=device).to(SHAPE.dtype)


def block_tables(num_requests: int, tokens: int, block_size: int, rng) -> list[list[int]]:
    """Each request's pages, spread over the pool as a running engine's are."""
    per_request = -(-tokens // block_size)
    free = list(range(num_requests * per_request))
    rng.shuffle(free)
    return [free[i * per_request:(i + 1) * per_request] for i in range(num_requests)]


def timed(fn, device: torch.device) -> float:
    wait_for_copies(device)
    start = time.perf_counter()
    fn()
    wait_for_copies(device)
    return time.perf_counter() - start


def measure(kv_slice: KVSlice, tier: CpuKVTier, args, device) -> dict:
    """Best of --repeats passes of every request's gather, then of every scatter."""
    tables = block_tables(args.num_requests, args.tokens, args.block_size, random.Random(0))
    num_blocks = len(tables) * len(tables[0])
    pool_k, pool_v = (make_pool(kv_slice, num_blocks, args.block_size, device) for _ in "kv")
    slots = [TierSlot(i * args.tokens, args.tokens) for i in range(args.num_requests)]

    def gather_all():
        return sum(gather(pool_k, pool_v, table, args.tokens, kv_slice, tier, slot)
                   for table, slot in zip(tables, slots))

    def scatter_all():
        return sum(scatter(tier, slot, args.tokens, kv_slice, pool_k, pool_v, table)
                   for table, slot in zip(tables, slots))

    moved = gather_all()  # warm-up; the bytes of one pass
    scatter_all()
    gather_s = min(timed(gather_all, device) for _ in range(args.repeats))
    scatter_s = min(timed(scatter_all, device) for _ in range(args.repeats))
    return {"bytes": moved, "gather_s": gather_s, "gather_gb_per_s": moved / gather_s / 1e9,
            "scatter_s": scatter_s, "scatter_gb_per_s": moved / scatter_s / 1e9}


def run_pinning(pinned: bool, args, device) -> list[dict]:
    tier = CpuKVTier.create(SHAPE, args.num_requests * args.tokens)
    try:
        start = time.perf_counter()
        if pinned:
            tier.page_lock()
        lock_s = time.perf_counter() - start
        return [{"slice": name, "pinned": pinned, "page_lock_s": lock_s,
                 "tier_bytes": tier.nbytes, **measure(kv_slice, tier, args, device)}
                for name, kv_slice in SLICES.items() if name in args.slices]
    finally:
        tier.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=None, help="default: 16 (cpu: 2)")
    p.add_argument("--tokens", type=int, default=None, help="per request; default 3000 (cpu: 200)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--pinned", choices=["both", "yes", "no"], default="both",
                   help="page-lock the tier or not (cpu: never)")
    p.add_argument("--slices", nargs="+", choices=list(SLICES), default=list(SLICES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    on_cpu = device.type == "cpu"
    args.num_requests = args.num_requests or (2 if on_cpu else 16)
    args.tokens = args.tokens or (200 if on_cpu else 3000)
    pinnings = [False] if on_cpu else {"both": [True, False], "yes": [True], "no": [False]}[
        args.pinned]
    rows = [row for pinned in pinnings for row in run_pinning(pinned, args, device)]
    result = {"device": torch.cuda.get_device_name(device) if not on_cpu else "cpu",
              "num_requests": args.num_requests, "tokens": args.tokens,
              "block_size": args.block_size, "rows": rows}
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
