"""Every FP8 GEMM candidate at 16-64 rows on the 8B's projections, as a fraction of the copy
bandwidth (issue 60: the decode b64 step's FP8 weight GEMM at >= 0.85 of it).

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_gemm_sweep.py [--rows 64 16 32]
             [--output F] [--workers 16] [--kernels more | b64 | tma_w8a8 ...] [--warm-only]
             [--x-fp8] [--chain] [--settings default NAME=VALUE[,..] ...]
             [--projections qkv o ...]
(`--rows 1 --x-fp8 --chain --kernels b1`: the GEMV's and the one-row TMA candidates.)
Candidates: cuBLASLt (`scaled_mm_linear`), the configs `fp8_gemm.linear` measures today
(`fp8_gemm.CONFIGS`) and the TMA kernel's (`fp8_gemm_tma.py`) registered and wider set.
Each is timed as `linear` times them (`gemm_timing`: CUDA graphs over weight copies past
L2, PDL suspended); `weight_of_copy` is the weight's bytes over the time over the copy
bandwidth (bytes read + written per second, the floors' convention), `of_floor` the same
with the activations' and output's bytes. Compiles run first in `--workers` processes (the
Triton cache on disk then serves the timing process).
--x-fp8: every candidate given x quantized already (decode's qkv, gate_up and down, whose
norm or SiLU·mul quantizes; cuBLASLt too); --chain: timed as PARASHIFT_GEMM_TIMING=chain
times (PDL on, each call after a small kernel writing its input); --settings: each
FP8 x FP8 Triton candidate timed under each setting of the launch-time switches (`default`:
the environment as it is; e.g. PARASHIFT_FP8_TMA_PREFETCH_KB=64, PARASHIFT_FP8_EARLY_SCALES=1;
the label ends "[setting]")."""
import argparse
import concurrent.futures
import contextlib
import itertools
import json
import multiprocessing
import os
import time

import torch
import triton.testing

from benchmarks.decode_throughput import env_settings, environment, parse_settings
from parashift.kernels import fp8_gemm, gemm_timing, pdl
from parashift.kernels.fp8_gemm import Config

PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
               "down": (4096, 14336)}
# (block_n, block_k, warps, stages, split): the TMA kernels' wider set, K split by tickets
TMA_SHAPES = ((64, 256, 4, 4, 1), (64, 256, 4, 4, 2), (64, 256, 4, 4, 4), (128, 256, 4, 3, 1),
              (128, 256, 4, 3, 2), (128, 256, 4, 3, 4), (128, 128, 4, 5, 1), (128, 128, 4, 5, 4),
              (128, 256, 8, 3, 4), (256, 128, 8, 4, 1), (256, 128, 8, 4, 2), (256, 128, 8, 4, 4))
# the widening by integer ops (tma_w8bits) on the likeliest of them
BITS_SHAPES = ((128, 256, 4, 3, 1), (128, 256, 4, 3, 2), (128, 256, 4, 3, 4), (64, 256, 4, 4, 1),
               (64, 256, 4, 4, 2), (128, 128, 4, 5, 1), (128, 128, 4, 5, 4), (256, 128, 8, 4, 1),
               (256, 128, 8, 4, 2))
# FP8 x FP8 by TMA around the first sweep's best (64x256, 4 warps, 4 stages; 256x128 at 64
# rows of gate_up): deeper pipelines, narrower K steps, more warps, other splits
W8A8_MORE = ((64, 256, 4, 5, 1), (64, 256, 4, 5, 2), (64, 256, 4, 6, 1), (64, 128, 4, 6, 1),
             (64, 128, 4, 6, 2), (64, 128, 4, 8, 2), (64, 256, 8, 4, 1), (64, 256, 4, 4, 3),
             (32, 256, 4, 4, 1), (256, 128, 8, 3, 1), (256, 256, 8, 2, 1), (128, 256, 8, 3, 1))
# "more": today's configs that won a shape in the first sweep (the baseline), and the CUDA
# tests' other TMA configs (compiled here first)
CURRENT_WINNERS = (Config("w8a8", 32, 256, 4, 4), Config("w8a8", 128, 256, 8, 2),
                   Config("w8a8", 32, 256, 4, 4, 2, tickets=True), Config("w8a8", 64, 256, 4, 3),
                   Config("w8a8", 32, 256, 4, 4, 4, tickets=True), Config("w8a8", 32, 512, 4, 2),
                   Config("w8a8", 64, 256, 4, 3, 4, tickets=True))
TESTED = (Config("tma_w8a8_p", 128, 256, 4, 3, 1), Config("tma_w8_p", 128, 256, 4, 3, 4),
          Config("tma_w8a8_p", 128, 256, 4, 3, 4, tickets=True),
          Config("tma_w8a8", 128, 256, 4, 3, 1, tickets=True), Config("tma_w8", 128, 256, 4, 3, 4),
          Config("tma_w8bits", 128, 256, 4, 3, 4, tickets=True),
          Config("tma_w8", 128, 256, 4, 3, 4, tickets=True))
# the persistent kernel's: one part (its loop pipelined across tiles), K split by tickets,
# or split by atomic adds (pipelined across items, a zeroing and a cast kernel more)
PERSISTENT_SHAPES = {True: ((128, 256, 4, 3, 4), (64, 256, 4, 4, 4)),
                     False: ((128, 256, 4, 3, 1), (128, 128, 4, 5, 1), (256, 128, 8, 4, 1),
                             (128, 256, 4, 3, 4))}


# "b64": around the 64-row winners (64x256 w4 s6 unsplit at qkv, o and down, 256x128 w8 s4 at
# gate_up): finer K steps deeper, splits of 2-3, 128- and 256-row weight tiles (half or a
# quarter of the activations' re-reads from L2) split to fill the SMs
B64_SHAPES = ((64, 256, 4, 6, 1), (64, 256, 4, 5, 1), (64, 128, 4, 8, 1), (64, 128, 4, 10, 1),
              (64, 128, 4, 12, 1), (64, 256, 4, 6, 2), (64, 256, 4, 6, 3), (64, 128, 4, 12, 2),
              (128, 128, 4, 8, 1), (128, 128, 4, 8, 2), (128, 128, 4, 8, 4), (128, 256, 4, 4, 2),
              (128, 256, 4, 4, 4), (128, 256, 8, 4, 2), (128, 128, 8, 8, 2), (256, 128, 8, 4, 1),
              (256, 128, 8, 5, 1), (256, 64, 8, 10, 1), (256, 128, 8, 4, 2), (128, 128, 8, 8, 1))
# and with tiles of 32 tokens (two row tiles at 64 rows: twice the programs, each weight tile
# read twice, the second mostly from L2): for o and down, whose 64-row tiles fill 64 SMs
B64_HALF_ROWS = ((64, 256, 4, 6, 1), (64, 256, 4, 8, 1), (64, 128, 4, 12, 1), (128, 256, 4, 4, 2),
                 (128, 128, 4, 8, 2))


# "b1": FP8 x FP8 by TMA at one to four rows (the row padded to a 16-token tile) around
# gate_up's best in an earlier sweep (256x128 w8 s4: 112 programs), two programs an SM
# (128-row tiles), deeper rings, and K split to fill the SMs at qkv and down (N 6,144 and 4,096)
B1_SHAPES = ((256, 128, 8, 4, 1), (256, 128, 8, 5, 1), (256, 64, 8, 8, 1), (256, 128, 8, 4, 2),
             (128, 128, 4, 4, 1), (128, 128, 4, 5, 1), (128, 128, 4, 6, 1), (128, 128, 4, 5, 2),
             (128, 256, 4, 3, 1), (64, 256, 4, 5, 2),
             (128, 256, 4, 4, 1), (128, 256, 4, 3, 2), (128, 256, 4, 3, 4), (64, 256, 4, 6, 1),
             (64, 256, 4, 4, 2), (64, 256, 4, 6, 2), (64, 128, 4, 8, 2), (64, 256, 4, 4, 4),
             (64, 256, 4, 5, 3), (64, 128, 4, 8, 4))
# and a program an SM over the (tile, part of K) items: no wave quantization at N 28,672
B1_PERSISTENT = ((64, 256, 4, 4, 1), (64, 256, 4, 4, 2), (64, 256, 4, 4, 4), (128, 128, 4, 5, 1),
                 (128, 256, 4, 3, 2))


def tma_configs() -> list[Config]:
    wider = [Config(kernel, *shape, tickets=True) for kernel, shape in
             itertools.product(("tma_w8", "tma_w8a8"), TMA_SHAPES)]
    wider += [Config("tma_w8bits", *shape, tickets=True) for shape in BITS_SHAPES]
    wider += [Config(kernel, *shape, tickets=tickets) for kernel in ("tma_w8_p", "tma_w8a8_p")
              for tickets, shapes in PERSISTENT_SHAPES.items() for shape in shapes]
    wider += [Config("tma_w8bits_p", 128, 256, 4, 3, split, tickets=split > 1)
              for split in (1, 4)]
    wider += [Config("tma_w8a8", *shape, tickets=True) for shape in W8A8_MORE]
    return list(dict.fromkeys(fp8_gemm.TMA_CONFIGS + tuple(wider)))


def configs_for(n: int, kernels: list[str] | None = None) -> list[Config]:
    """Today's configs and the TMA ones that fit N: all, or those of `kernels` ("more": the
    registered ones, W8A8_MORE, TESTED and today's CURRENT_WINNERS alone)."""
    if kernels and "b1" in kernels:
        configs = fp8_gemm.GEMV_CONFIGS + tuple(
            Config("tma_w8a8", *shape, tickets=True) for shape in B1_SHAPES) + tuple(
            Config("tma_w8a8_p", *shape, tickets=shape[-1] > 1) for shape in B1_PERSISTENT)
    elif kernels and "b64" in kernels:
        configs = (fp8_gemm.TMA_CONFIGS + CURRENT_WINNERS[:2]
                   + tuple(Config("tma_w8a8", *shape, tickets=True) for shape in B64_SHAPES)
                   + tuple(Config("tma_w8a8", *shape, tickets=True, max_block_m=32)
                           for shape in B64_HALF_ROWS))
    elif kernels and "more" in kernels:
        configs = CURRENT_WINNERS + fp8_gemm.TMA_CONFIGS + tuple(
            Config("tma_w8a8", *shape, tickets=True) for shape in W8A8_MORE) + TESTED
    else:
        configs = fp8_gemm.CONFIGS + tuple(c for c in tma_configs()
                                           if kernels is None or c.kernel in kernels)
    return [c for c in dict.fromkeys(configs) if c.block_n <= triton.next_power_of_2(n)]


def operands(rows: int, n: int, k: int):
    weight = (torch.randn(n, k, device="cuda") * 0.05).to(fp8_gemm.FP8)
    scale = torch.rand(n, device="cuda") * 0.01 + 0.001
    return torch.randn(rows, k, device="cuda", dtype=torch.bfloat16), weight, scale


def compile_configs(jobs: list[tuple]) -> list[str]:
    """Compiles (runs once) each (rows, config, PDL on[, setting]) on a small weight (the
    projections' specialization: N, K and strides multiples of 16, K a multiple of the
    tiles); the failures, as text."""
    failed = []
    for rows, config, with_pdl, *setting in jobs:
        x, weight, scale = operands(rows, 256, 4096)
        try:
            with contextlib.nullcontext() if with_pdl else pdl.suspended():
                under(setting[0] if setting else "default", lambda: fp8_gemm.fp8_weight_linear(
                    x, weight, scale, None, config))
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            failed.append(f"{rows} {config}: {str(exc)[:300]}")
    torch.cuda.synchronize()
    return failed


def engine_jobs(settings: tuple[str, ...] = ()) -> list[tuple]:
    """What an FP8 decode engine's start-up compiles of the GEMM (graphs of 1-64 sequences):
    every candidate `fp8_gemm.linear` times at 1, 2, 4, 16, 32 and 64 rows (PDL off), and
    those the first sweep found fastest somewhere at 16-64 rows with PDL on at each captured
    row count (the graphs' calls), the TMA ones also under each of `settings`."""
    timed = [(rows, c, False) for rows in (1, 2, 4, 16, 32, 64)
             for c in fp8_gemm.candidates(rows, 1 << 16)]
    likely = [c for c in fp8_gemm.TMA_CONFIGS + CURRENT_WINNERS
              if c in fp8_gemm.candidates(64, 1 << 16)]
    captured = (8, 16, 24, 32, 48, 64)
    return timed + [(rows, c, True) for rows in captured for c in likely] + [
        (rows, c, True, setting) for setting in settings if setting != "default"
        for rows in captured
        for c in fp8_gemm.TMA_CONFIGS if c in likely]


def precompile(jobs: list[tuple], workers: int, compile_jobs=compile_configs) -> list[str]:
    """`compile_jobs` (a module-level function: the failures of its jobs, as text) over the
    jobs in `workers` processes."""
    chunks = [jobs[i::workers] for i in range(workers)]
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            return [line for failed in pool.map(compile_jobs, chunks) for line in failed]
    except concurrent.futures.process.BrokenProcessPool as exc:  # the timing compiles the rest
        return [f"compile workers died: {exc}"]


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms * 1e-3)


def sweep(rows: int, n: int, k: int, bandwidth: float, kernels: list[str] | None,
          x_fp8: bool = False, chain: bool = False, settings: tuple[str, ...] = ("default",)
          ) -> dict:
    x, weight, scale = operands(rows, n, k)
    copies = gemm_timing.weight_copies(weight)
    # what the candidates read (E4M3 rows with their scales where x_fp8, else x), rewritten
    # before each call by the chain's kernel from `source`
    quantized = fp8_gemm.quantize_rows(x)
    source = quantized[0] if x_fp8 else x
    written = source.clone()
    given = (written, quantized[1]) if x_fp8 else None
    xin = x if x_fp8 else written
    runs = {None: lambda i: fp8_gemm.scaled_mm_linear(xin, copies[i], scale, None, given)}
    for c in configs_for(n, kernels):
        for setting in settings if "w8a8" in c.kernel else ("default",):
            key = c if setting == "default" else (c, setting)
            runs[key] = lambda i, c=c, setting=setting: under(
                setting, lambda: fp8_gemm.fp8_weight_linear(xin, copies[i], scale, None, c,
                                                            given))
    with contextlib.nullcontext() if chain else pdl.suspended():
        timings = gemm_timing.replayed_timings_ms(runs, len(copies),
                                                  (source, written) if chain else None)
    # the GEMM alone where the op before quantized x (decode's qkv, gate_up and down): the
    # fastest FP8 x FP8 configs of each kernel again, given x in E4M3
    prequantized = [] if given else [
        c for family in ("w8a8", "tma_w8a8", "tma_w8a8_p")
        for c in sorted((c for c in timings if isinstance(c, Config) and c.kernel == family),
                        key=timings.get)[:2]]
    with pdl.suspended():
        alone = gemm_timing.replayed_timings_ms(
            {c: lambda i, c=c: fp8_gemm.fp8_weight_linear(x, copies[i], scale, None, c,
                                                          quantized)
             for c in prequantized}, len(copies))
    weight_us = n * k / bandwidth * 1e6
    floor_us = (n * k + 2 * rows * (k + n)) / bandwidth * 1e6

    def entry(name, ms):
        return dict(config=name, us=round(1e3 * ms, 2),
                    weight_of_copy=round(weight_us / (1e3 * ms), 3),
                    of_floor=round(floor_us / (1e3 * ms), 3))
    ranked = sorted(timings, key=timings.get)
    entries = [entry(label(c), timings[c]) for c in ranked]
    configs = [c[0] if isinstance(c, tuple) else c for c in ranked]
    current = [e for c, e in zip(configs, entries)
               if c is None or c.kernel in ("w8", "w8a8", "gemv")]
    new = [e for c, e in zip(configs, entries) if c is not None and c.kernel.startswith("tma")]
    return dict(rows=rows, n=n, k=k, best_current=current[0], best_tma=new[0] if new else None,
                x_quantized_before=[entry(label(c), alone[c])
                                    for c in sorted(alone, key=alone.get)],
                candidates=entries)


def label(c: Config | tuple[Config, str] | None) -> str:
    if c is None:
        return "cuBLASLt"
    if isinstance(c, tuple):
        return f"{label(c[0])} [{c[1]}]"
    return (f"{c.kernel} {c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} "
            f"split {c.split_k}{' tickets' if c.tickets else ''}"
            f"{f' m<={c.max_block_m}' if c.max_block_m else ''}")


def under(setting: str, run):
    """run() with the setting's switches set ("default": as they are), read at launch."""
    with environment({} if setting == "default" else parse_settings(setting)):
        return run()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[64, 16, 32])
    p.add_argument("--output", default=None)
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--warm-only", action="store_true",
                   help="only compile (in --workers processes, into Triton's cache) what an FP8 "
                   "decode engine's start-up compiles of the GEMM (`engine_jobs`), time nothing")
    p.add_argument("--x-fp8", action="store_true",
                   help="every candidate given x quantized already (as the fused norms hand it)")
    p.add_argument("--chain", action="store_true",
                   help="timed as PARASHIFT_GEMM_TIMING=chain: PDL on, after an input write")
    p.add_argument("--settings", nargs="+", default=["default"],
                   type=lambda v: v if v == "default" else env_settings(v),
                   help="each FP8 x FP8 Triton candidate timed under each (NAME=VALUE[,..] or "
                   "default); with --warm-only: the engine's TMA configs compiled under each too")
    p.add_argument("--warm-rows", type=int, nargs="+", default=None,
                   help="with --warm-only: only these row counts' jobs")
    p.add_argument("--no-dot-configs", action="store_true",
                   help="with --warm-only: without fp8_gemm.py's tl.dot configs")
    p.add_argument("--projections", nargs="+", default=list(PROJECTIONS),
                   choices=list(PROJECTIONS))
    p.add_argument("--kernels", nargs="+", default=None,
                   help="the TMA kernels to time (fp8_gemm_tma.KERNELS, or more: the "
                   "registered configs and W8A8_MORE; default all)")
    args = p.parse_args()
    start = time.time()
    if args.warm_only:
        if args.no_dot_configs:
            fp8_gemm.CONFIGS = ()
        jobs = [job for job in engine_jobs(tuple(args.settings))
                if args.warm_rows is None or job[0] in args.warm_rows]
    else:
        jobs = [(rows, c, args.chain, setting) for rows in args.rows
                for c in configs_for(1 << 16, args.kernels)
                for setting in (args.settings if "w8a8" in c.kernel else ["default"])]
    failed = precompile(jobs, args.workers) if args.workers > 1 else []
    print(json.dumps({"compiled_s": round(time.time() - start, 1), "jobs": len(jobs),
                      "failed": failed}), flush=True)
    if args.warm_only:
        return
    bandwidth = copy_bandwidth()
    results = []
    for rows in args.rows:
        for name in args.projections:
            n, k = PROJECTIONS[name]
            results.append(dict(proj=name, **sweep(rows, n, k, bandwidth, args.kernels,
                                                   args.x_fp8, args.chain,
                                                   tuple(args.settings))))
            top = results[-1]
            print(json.dumps(dict(proj=name, rows=rows, best_current=top["best_current"],
                                  best_tma=top["best_tma"], top5=top["candidates"][:5],
                                  x_quantized_before=top["x_quantized_before"][:3])),
                  flush=True)
            torch.cuda.empty_cache()
            if args.output:  # after each shape: a run cut short keeps what it measured
                with open(args.output, "w") as f:
                    json.dump(dict(device=torch.cuda.get_device_name(),
                                   copy_bandwidth_tb_s=bandwidth / 1e12, failed=failed,
                                   x_fp8=args.x_fp8, chain=args.chain,
                                   results=results), f, indent=1)
    print(json.dumps({"total_s": round(time.time() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
