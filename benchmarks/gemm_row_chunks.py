"""The 8B's projections at long-prompt rows as one cuBLAS call or in row chunks (issue 61):
cuBLAS runs them with 192x192 tiles at 16k-32k rows and with 320x128 / 256x128 at 4k; does a
long prompt's GEMM gain from calls of fewer rows? (Measured 2026-11-30: no, under the power
cap; the engine switch tried with it was left out, benchmark_log.)

Usage (GPU): PYTHONPATH=. python3 benchmarks/gemm_row_chunks.py [--rows 8192 16384 32768]
    [--chunks 0 8192 4096 2048] [--sustained-s 2] [--output FILE]
bf16, random weights (normal / 64) and inputs. Per projection (qkv, o, gate_up, down), rows
and chunk (0: one call): ms (triton's do_bench), TFLOP/s and the kernel cuBLAS ran (one call
under torch.profiler). Then the four projections of a layer in turn at the most rows, one
call against each chunk, called back to back for --sustained-s each (as a long prompt's step
runs them), their ms a layer in the first and last tenth of the run."""
import argparse
import json
import statistics
import time

import torch
import triton.testing

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def gemm(x, w, chunk: int):
    """x @ w.T as one call, or as calls of `chunk` rows into one output."""
    if not chunk or x.shape[0] <= chunk:
        return torch.nn.functional.linear(x, w)
    out = x.new_empty(x.shape[0], w.shape[0])
    for start in range(0, x.shape[0], chunk):
        torch.mm(x[start:start + chunk], w.t(), out=out[start:start + chunk])
    return out


def kernels_run(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"})


def operands(rows: int):
    gen = torch.Generator("cuda").manual_seed(rows)
    x = {k: torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
         for k in {k for k, _ in SHAPES.values()}}
    w = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / 64
         for name, (k, n) in SHAPES.items()}
    return x, w


def by_chunk(rows_list, chunks) -> list[dict]:
    out = []
    for rows in rows_list:
        x, w = operands(rows)
        for name, (k, n) in SHAPES.items():
            reference = gemm(x[k], w[name], 0)
            for chunk in chunks:
                if chunk and chunk >= rows:
                    continue
                fn = lambda: gemm(x[k], w[name], chunk)  # noqa: E731
                same = bool(torch.equal(fn()[: min(chunk or rows, rows)],
                                        gemm(x[k][: chunk or rows], w[name], 0)))
                ms = triton.testing.do_bench(fn, warmup=5, rep=60)
                row = dict(gemm=name, rows=rows, chunk=chunk, ms=round(ms, 4),
                           tflops=round(2 * rows * k * n / ms / 1e9, 1),
                           kernels=kernels_run(fn), first_chunk_bits_equal=same,
                           max_abs_diff_vs_one_call=float((fn().float() - reference.float())
                                                          .abs().max()))
                print(json.dumps(row), flush=True)
                out.append(row)
        del x, w
        torch.cuda.empty_cache()
    return out


def sustained(rows: int, chunks, seconds: float) -> list[dict]:
    x, w = operands(rows)
    out = []
    for chunk in chunks:
        def layer():
            for name, (k, _) in SHAPES.items():
                gemm(x[k], w[name], chunk)
        layer()
        torch.cuda.synchronize()
        time.sleep(1.0)  # each variant from the same idle start
        start = time.perf_counter()
        events = [torch.cuda.Event(enable_timing=True)]
        events[0].record()
        while time.perf_counter() - start < seconds:
            layer()
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
        tenth = max(1, len(ms) // 10)
        flops = sum(2 * rows * k * n for k, n in SHAPES.values())
        row = dict(rows=rows, chunk=chunk, layers=len(ms),
                   first_tenth_ms=round(statistics.median(ms[:tenth]), 4),
                   last_tenth_ms=round(statistics.median(ms[-tenth:]), 4),
                   last_tflops=round(flops / statistics.median(ms[-tenth:]) / 1e9, 1))
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 8192, 4096, 2048])
    p.add_argument("--sustained-s", type=float, default=0.0)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  rows=by_chunk(args.rows, args.chunks))
    if args.sustained_s > 0:
        result["sustained"] = sustained(max(args.rows), args.chunks, args.sustained_s)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
