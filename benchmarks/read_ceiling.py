"""What a kernel that only reads a weight reaches on this GPU: the ceiling of a GEMV at one row
(issue 60). Each candidate streams an [N, K] byte matrix once (XOR of its bytes, one value a
program stored: next to no arithmetic), timed as the GEMMs are (`gemm_timing`: CUDA graphs
of back-to-back calls over copies past L2, medians of interleaved rounds), at the 8B's four
projection shapes in E4M3 and at 1 GiB. Loads: "regs" (16-byte loads into registers,
NUM_STAGES > 1 pipelined by the compiler through shared memory) or "tma" (tensor
descriptors into shared memory, NUM_STAGES deep); "ahead": a regs program's first tile
loaded before the PDL wait (the weight is no earlier kernel's output); hints on the regs
loads: "evict_first" (L2 eviction priority) or "cg" (cached in L2 only, not L1). Each
candidate's bytes per second over the copy bandwidth (bytes read + written per second of a
1 GiB device copy, the floors' convention) and over the HBM's 4.8 TB/s.
--chain: timed as PARASHIFT_GEMM_TIMING=chain times the GEMMs (each call after a small
PDL-aware kernel writing a row of 4,096 bf16, PDL as the engine launches), the kernel
PDL-aware (its loads after the wait, but "ahead"'s first tile).

Usage (GPU): PYTHONPATH=. python3 benchmarks/read_ceiling.py [--output F] [--chain]
    [--shapes qkv o gate_up down 1gib]"""
import argparse
import contextlib

import torch
import triton
import triton.language as tl

from benchmarks import pdl_chain
from benchmarks.fp8_gemm_sweep import PROJECTIONS, copy_bandwidth
from parashift.kernels import gemm_timing, pdl

SHAPES = {**PROJECTIONS, "1gib": (65536, 16384)}
HBM_TB_S = 4.8
HINTS = {"": (None, ""), "evict_first": ("evict_first", ""), "cg": (None, ".cg")}
# (loads, block_n, block_k, warps, stages[, variant: ahead or a hint])
CANDIDATES = (("regs", 8, 1024, 4, 1), ("regs", 8, 1024, 4, 1, "ahead"),
              ("regs", 8, 1024, 4, 1, "evict_first"), ("regs", 8, 1024, 4, 1, "cg"),
              ("regs", 8, 2048, 8, 1), ("regs", 8, 2048, 8, 1, "ahead"),
              ("regs", 4, 2048, 4, 1), ("regs", 4, 2048, 4, 1, "ahead"),
              ("regs", 16, 512, 4, 3), ("regs", 16, 512, 4, 3, "cg"), ("regs", 32, 256, 4, 4),
              ("tma", 8, 256, 4, 8), ("tma", 16, 256, 4, 6), ("tma", 32, 256, 4, 6),
              ("tma", 64, 256, 8, 4))


@triton.jit
def _load_tile(w_ptr, rows, cols, k0, stride_wn, EVICT: tl.constexpr, CACHE: tl.constexpr):
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wn + k0 + cols[None, :],
                   eviction_policy=EVICT, cache_modifier=CACHE)


@triton.jit
def _read_kernel(w_ptr, w_desc, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, TMA: tl.constexpr,
                 AHEAD: tl.constexpr, EVICT: tl.constexpr, CACHE: tl.constexpr,
                 USE_PDL: tl.constexpr):
    first_n = tl.program_id(0) * BLOCK_N
    rows = (first_n + tl.arange(0, BLOCK_N)) % N
    cols = tl.max_contiguous(tl.arange(0, BLOCK_K), 16)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.uint8)
    if AHEAD:
        acc = _load_tile(w_ptr, rows, cols, 0, stride_wn, EVICT, CACHE)
    pdl.start(USE_PDL)
    for k0 in tl.range(BLOCK_K if AHEAD else 0, K, BLOCK_K, num_stages=NUM_STAGES):
        if TMA:
            acc ^= w_desc.load([first_n, k0])
        else:
            acc ^= _load_tile(w_ptr, rows, cols, tl.multiple_of(k0, BLOCK_K), stride_wn, EVICT,
                              CACHE)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


def read(w: torch.Tensor, out: torch.Tensor, loads: str, block_n: int, block_k: int,
         warps: int, stages: int, variant: str = "") -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor
    n, k = w.shape
    desc = TensorDescriptor(w, [n, k], [w.stride(0), 1], [block_n, min(block_k, 256)])
    evict, cache = HINTS.get(variant, HINTS[""])
    _read_kernel[(triton.cdiv(n, block_n),)](
        w, desc, out, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=stages,
        TMA=loads == "tma", AHEAD=variant == "ahead", EVICT=evict, CACHE=cache,
        num_warps=warps, **pdl.launch_options(w.device))


def measure(name: str, bandwidth: float, chain: bool) -> dict:
    n, k = SHAPES[name]
    w = torch.randint(0, 255, (n, k), dtype=torch.uint8, device="cuda")
    copies = gemm_timing.weight_copies(w)
    out = torch.empty(n, dtype=torch.uint8, device="cuda")
    row = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    runs = {c: lambda i, c=c: read(copies[i], out, *c) for c in CANDIDATES}
    with contextlib.nullcontext() if chain else pdl.suspended():
        timings = gemm_timing.replayed_timings_ms(runs, len(copies),
                                                  (row, row.clone()) if chain else None)
    entries = [dict(config=" ".join(map(str, c)), us=round(1e3 * ms, 2),
                    of_copy=round(n * k / (ms * 1e-3) / bandwidth, 3),
                    of_hbm=round(n * k / (ms * 1e-3) / (HBM_TB_S * 1e12), 3))
               for c, ms in sorted(timings.items(), key=lambda kv: kv[1])]
    del copies
    torch.cuda.empty_cache()
    return dict(shape=name, n=n, k=k, chain=chain, best=entries[0], candidates=entries)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--chain", action="store_true",
                   help="each call after a PDL-aware kernel writing a row, PDL on")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    bandwidth = copy_bandwidth()
    results = []
    for name in args.shapes:
        results.append(measure(name, bandwidth, args.chain))
        pdl_chain.report(results, bandwidth, args.output)


if __name__ == "__main__":
    main()
