"""FP8 GEMMs of the 8B layer's projections on one GPU (issue 60).

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_gemm.py [--rows 1 4 16 64 256 4096] [--output F]
             [--tp 2 4] [--bf16-only]   (--tp: the projections' tensor-parallel shards, a
             rank's; --bf16-only: the bf16 GEMM alone, for the cost profile's `gemm_timed`)
Per projection and row count, each candidate's time per call replayed from a CUDA graph (as
decode runs) over COPIES weights in turn, so no weight stays in L2: bf16 (`skinny_gemm.linear`:
the skinny kernel where it wins, else cuBLAS), cuBLASLt FP8 (`torch._scaled_mm`, activations
quantized per token by one kernel, counted) and every Triton FP8 config (the GEMV ones at 1-4
rows, best of them also apart: `gemv_us`); each as a fraction of its bytes floor (weight +
activation + output bytes over the measured copy bandwidth), and what `fp8_gemm.linear`
picks (its own timing: kernels/gemm_timing.py)."""
import argparse
import json

import torch
import triton.testing

from parashift.kernels import fp8_gemm, skinny_gemm

PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
               "down": (4096, 14336)}
COPIES = 8
REPLAYS = 20


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * src.numel() / (ms * 1e-3)


def graph_us(calls) -> float:
    """µs per call of `calls` (one per weight copy), captured once and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * len(calls))


def shards(tp: int) -> dict[str, tuple[int, int]]:
    """A TP rank's share of each projection: qkv and gate_up split their outputs, o and
    down their inputs (tp 1: the projections whole)."""
    split_n = {"qkv", "gate_up"}
    return {(name if tp == 1 else f"{name}/tp{tp}"):
            ((n // tp, k) if name in split_n else (n, k // tp))
            for name, (n, k) in PROJECTIONS.items()}


def measure_bf16(name, n, k, m, bandwidth) -> dict:
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
           for _ in range(COPIES)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    skinny_gemm.linear(x, w16[0], None)  # its choice is made outside the capture
    row = {"proj": name, "n": n, "k": k, "rows": m,
           "bf16_us": graph_us([lambda w=w: skinny_gemm.linear(x, w, None) for w in w16])}
    row["bf16_of_floor"] = (2 * n * k + 2 * m * (k + n)) / bandwidth * 1e6 / row["bf16_us"]
    return row


def measure(name, n, k, m, bandwidth) -> dict:
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
           for _ in range(COPIES)]
    scales = [w.float().abs().amax(1, keepdim=True) / fp8_gemm.FP8_MAX for w in w16]
    w8 = [(w.float() / s).to(fp8_gemm.FP8) for w, s in zip(w16, scales)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ (w8[0].float() * scales[0]).t()
    skinny_gemm.linear(x, w16[0], None)  # its choice is made outside the capture
    row = {"proj": name, "n": n, "k": k, "rows": m,
           "bf16_us": graph_us([lambda w=w: skinny_gemm.linear(x, w, None) for w in w16]),
           "scaled_mm_us": graph_us([lambda w=w, s=s: fp8_gemm.scaled_mm_linear(x, w, s, None)
                                     for w, s in zip(w8, scales)])}
    if m <= fp8_gemm.MAX_ROWS:
        triton_us = {}
        for config in fp8_gemm.candidates(m, n):
            try:
                fp8_gemm.fp8_weight_linear(x, w8[0], scales[0], None, config)
                triton_us[config] = graph_us([
                    lambda w=w, s=s, c=config: fp8_gemm.fp8_weight_linear(x, w, s, None, c)
                    for w, s in zip(w8, scales)])
            except Exception:  # noqa: BLE001 -- a config the device cannot run
                continue
        best = min(triton_us, key=triton_us.__getitem__)
        out = fp8_gemm.fp8_weight_linear(x, w8[0], scales[0], None, best)
        row.update(triton_us=triton_us[best], triton_config=str(best),
                   triton_rel_err=float((out.float() - ref).norm() / ref.norm()))
        gemv = [c for c in triton_us if c.kernel == "gemv"]
        if gemv:
            best_gemv = min(gemv, key=triton_us.__getitem__)
            row.update(gemv_us=triton_us[best_gemv], gemv_config=str(best_gemv))
    chosen = fp8_gemm.linear(x, w8[0], scales[0], None)
    row["chosen_rel_err"] = float((chosen.float() - ref).norm() / ref.norm())
    best_us = min(row.get("triton_us", float("inf")), row["scaled_mm_us"])
    fp8_bytes, bf16_bytes = n * k + 2 * m * (k + n), 2 * n * k + 2 * m * (k + n)
    row.update(fp8_floor_us=fp8_bytes / bandwidth * 1e6,
               of_fp8_floor=fp8_bytes / bandwidth * 1e6 / best_us,
               bf16_of_floor=bf16_bytes / bandwidth * 1e6 / row["bf16_us"],
               speedup_vs_bf16=row["bf16_us"] / best_us)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 256, 4096])
    p.add_argument("--output", default=None)
    p.add_argument("--tp", type=int, nargs="+", default=[1])
    p.add_argument("--bf16-only", action="store_true")
    args = p.parse_args()
    bandwidth = copy_bandwidth()  # bytes read + written per second: the floors' convention
    rows = []
    timed = measure_bf16 if args.bf16_only else measure
    for name, (n, k) in {key: nk for tp in args.tp for key, nk in shards(tp).items()}.items():
        for m in args.rows:
            rows.append(timed(name, n, k, m, bandwidth))
            print(json.dumps({key: (round(v, 3) if isinstance(v, float) else v)
                              for key, v in rows[-1].items()}), flush=True)
            torch.cuda.empty_cache()
    summary = {"device": torch.cuda.get_device_name(), "copy_bandwidth_tb_s": bandwidth / 1e12,
               "chosen": fp8_gemm.chosen(), "rows": rows}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
