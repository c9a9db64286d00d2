"""Deterministic mode's GEMM tiles (parashift/deterministic/triton_matmul.py): does every tile
configuration give the same bits as 64x64, and how fast is each, beside cuBLAS.

Usage (CUDA): PYTHONPATH=. python3 benchmarks/det_tiles.py [--rows 1 64 256 512 4096]
Prints one JSON line per (projection, rows): each configuration's (bit-equal to 64x64, ms) with
its K chunks summed in a loop per chunk ("-n"), in one K loop ("-1"), in one K loop loaded by
TMA ("-tma") and spread over programs
("-spread", up to 512 rows). The 8B shape's projections, K in 8 chunks (the canonical order).
--wave-check: the engine's tiles at whole and partial waves over the SMs; --chunk-check: the
column-parallel projections with K in 8 chunks against one (weights from HBM in both);
--column-check: the column-parallel projections in one K chunk, whole and as a TP=2 rank's
half, under each tile configuration loaded by pointers and by TMA (weights from HBM);
--split-check: the same, K in 1, 2 and 4 chunks, in program and spread over programs."""
import argparse
import json
import time

import torch

import parashift.deterministic.triton_matmul as tm
from gemm_backends import rotating_ms, weight_copies  # benchmarks/ (this folder is on sys.path)

CONFIGS = [(64, 64, 64, 4, 3), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3),
           (128, 64, 64, 4, 4), (16, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 4),
           # narrower columns: more programs at decode batches without spreading the chunks
           (64, 32, 64, 4, 4), (64, 32, 64, 2, 5), (32, 32, 64, 2, 5), (128, 32, 64, 4, 4),
           (64, 16, 64, 2, 6), (32, 64, 64, 4, 4), (64, 64, 64, 4, 5), (128, 64, 64, 8, 4),
           # a decode batch of 256 rows in one row of tiles: each weight tile read once
           (256, 64, 64, 8, 3), (256, 64, 64, 8, 4), (256, 32, 64, 8, 4), (256, 32, 64, 4, 4),
           (256, 128, 64, 8, 3), (256, 16, 64, 4, 5)]
PROJECTIONS = [(6144, 4096, "qkv"), (4096, 4096, "o"), (28672, 4096, "gate_up"),
               (4096, 14336, "down")]


def run(x, w, tiles, one_loop: bool, spread: bool = False, tma: bool = False,
        chunks: int = 8):
    tm.PINNED_TILES, tm.ONE_LOOP, tm.TMA = tiles, one_loop, "1" if tma else "0"
    return tm.linear(x, w, None, chunks, spread=spread)


def timed_ms(fn, repeats: int = 10) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - start) / repeats * 1e3, 4)


def wave_check(rows: int) -> None:
    """The engine's deterministic GEMM (its own tiles) at each projection's width and at
    the widths that make whole waves of output tiles over the SMs: if the time follows the
    waves, not the work, a last partial wave is what it loses (and what a stream-K split
    at the K chunks' edges would win back)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k, name in PROJECTIONS:
        block_m, block_n = tm.tiles_for(rows, tma=True, n=n, k=k)[:2]
        row_tiles = -(-rows // block_m)
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        out = dict(projection=name, rows=rows, tile=(block_m, block_n))
        waves = row_tiles * (n // block_n) / sms
        for whole in sorted({max(1, int(waves)), int(waves) + 1}):
            width = whole * sms // row_tiles * block_n
            for label, width_n in ((f"n{n}", n), (f"n{width}", width)):
                if label in out:
                    continue
                weights = weight_copies(width_n, k, max(2, (256 << 20) // (width_n * k * 2)))
                det = rotating_ms(lambda w: tm.linear(x, w, None, 8), weights, 50)
                blas = rotating_ms(lambda w: torch.nn.functional.linear(x, w), weights, 50)
                tiles = row_tiles * -(-width_n // block_n)
                out[label] = dict(waves=round(tiles / sms, 2), det_ms=round(det, 4),
                                  cublas_ms=round(blas, 4),
                                  det_us_per_wave=round(det * 1e3 / -(-tiles // sms), 2))
                del weights
        print(json.dumps(out), flush=True)


def chunk_check(rows: int) -> None:
    """The column-parallel projections (K unsplit by any plan) with K in 8 chunks (the
    engine's `column_chunks(4096)`) against one, beside cuBLAS; weights from HBM."""
    shapes = [(6144, 4096, "qkv"), (28672, 4096, "gate_up"), (128256, 4096, "head")]
    for n, k, name in shapes:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        weights = weight_copies(n, k, max(2, (512 << 20) // (n * k * 2)))
        out = dict(projection=name, rows=rows, cublas_ms=round(
            rotating_ms(lambda w: torch.nn.functional.linear(x, w), weights, 50), 4))
        for chunks in (8, 1):
            out[f"chunks{chunks}_ms"] = round(
                rotating_ms(lambda w: tm.linear(x, w, None, chunks), weights, 50), 4)
        del weights
        print(json.dumps(out), flush=True)


COLUMN_CONFIGS = [(128, 64, 64, 4, 4), (64, 64, 64, 4, 5), (64, 128, 64, 4, 4),
                  (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 8, 3),
                  (128, 128, 64, 4, 4), (64, 32, 64, 4, 4), (128, 32, 64, 4, 4),
                  (256, 64, 64, 8, 3), (256, 128, 64, 8, 3)]


def column_check(rows: int) -> None:
    """Each column-parallel projection (one K chunk) whole and as one of two TP ranks' halves:
    the engine's own choice, cuBLAS, and every COLUMN_CONFIGS tile by pointers and by TMA,
    each (bits equal to the engine's, ms in CUDA graphs)."""
    shapes = [(6144, 4096, "qkv"), (28672, 4096, "gate_up"), (128256, 4096, "head")]
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    for n, k, name in shapes:
        for tp in (1, 2):
            width = n // tp
            weights = weight_copies(width, k, max(2, (512 << 20) // (width * k * 2)))
            tm.PINNED_TILES, tm.ONE_LOOP, tm.TMA = None, True, "auto"
            ref = tm.linear(x, weights[0], None, 1)
            out = dict(projection=name, tp=tp, n=width, rows=rows,
                       engine=(tm.tiles_for(rows, tm._takes_tma(x, weights[0], k, 64), width,
                                            k)[:2], round(graphed_ms(
                                   lambda w: tm.linear(x, w, None, 1), weights), 4)),
                       cublas_ms=round(graphed_ms(
                           lambda w: torch.nn.functional.linear(x, w), weights), 4))
            for tiles in COLUMN_CONFIGS:
                for tma in (False, True):
                    try:
                        same = torch.equal(run(x, weights[0], tiles, True, tma=tma, chunks=1),
                                           ref)
                        ms = graphed_ms(lambda w: run(x, w, tiles, True, tma=tma, chunks=1),
                                        weights)
                    except Exception as error:  # a tile that does not fit shared memory
                        out["x".join(map(str, tiles)) + ("-tma" if tma else "")] = str(error)[:60]
                        continue
                    out["x".join(map(str, tiles)) + ("-tma" if tma else "")] = (same,
                                                                                round(ms, 4))
            tm.PINNED_TILES, tm.TMA = None, "auto"
            del weights
            print(json.dumps(out), flush=True)


def graphed_ms(fn, weights: list[torch.Tensor], reps: int = 40) -> float:
    """ms per call of fn(w), the weights taken in turn, `reps` calls captured in one CUDA
    graph (as the engine's decode steps run: no launch gaps)."""
    for w in weights:
        fn(w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(weights[i % len(weights)])
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def split_check(rows: int) -> None:
    """Each column-parallel projection of K 4,096, whole and as a TP=2 rank's half, with K in
    1, 2 and 4 chunks, summed in program and spread over programs, beside cuBLAS (ms, in
    CUDA graphs)."""
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    for n, k, name in [(6144, 4096, "qkv"), (28672, 4096, "gate_up")]:
        for tp in (1, 2):
            width = n // tp
            weights = weight_copies(width, k, max(2, (512 << 20) // (width * k * 2)))
            tm.PINNED_TILES, tm.ONE_LOOP, tm.TMA = None, True, "auto"
            out = dict(projection=name, tp=tp, n=width, rows=rows, cublas_ms=round(
                graphed_ms(lambda w: torch.nn.functional.linear(x, w), weights), 4))
            for chunks in (1, 2, 4):
                for spread in (False, True)[:1 + (chunks > 1)]:
                    out[f"chunks{chunks}" + ("-spread" if spread else "")] = round(graphed_ms(
                        lambda w: tm.linear(x, w, None, chunks, spread=spread), weights), 4)
            del weights
            print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256, 512, 4096])
    p.add_argument("--configs", type=int, nargs="+", default=None, metavar="I",
                   help="indices into CONFIGS (default: all)")
    p.add_argument("--wave-check", action="store_true",
                   help="only the engine's tiles at whole and partial waves (wave_check)")
    p.add_argument("--chunk-check", action="store_true",
                   help="only K in 8 chunks against one for the column-parallel projections")
    p.add_argument("--column-check", action="store_true",
                   help="only the column-parallel projections, whole and a TP=2 rank's half")
    p.add_argument("--split-check", action="store_true",
                   help="only K 4,096's column-parallel products in 1, 2 and 4 chunks")
    args = p.parse_args()
    checks = {"split_check": split_check, "column_check": column_check,
              "chunk_check": chunk_check, "wave_check": wave_check}
    for name, check in checks.items():
        if getattr(args, name):
            for rows in args.rows:
                check(rows)
            return
    configs = CONFIGS if args.configs is None else [CONFIGS[i] for i in args.configs]
    torch.manual_seed(0)
    for n, k, name in PROJECTIONS:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = run(x, w, CONFIGS[0], False)
            row = dict(projection=name, rows=m,
                       cublas_ms=timed_ms(lambda: torch.nn.functional.linear(x, w)))
            for tiles in configs:
                label = "x".join(map(str, tiles))
                variants = [("-n", False, False, False), ("-1", True, False, False),
                            ("-tma", True, False, True)]
                variants += [("-spread", True, True, False)] if m <= 512 else []
                for suffix, one_loop, spread, tma in variants:
                    same = torch.equal(run(x, w, tiles, one_loop, spread, tma), ref)
                    row[label + suffix] = (same, timed_ms(
                        lambda: run(x, w, tiles, one_loop, spread, tma)))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
