"""A prefill step's device time by kind of kernel, from a torch.profiler Chrome trace
(prefill_phases.py --trace-dir writes one; issue 61).

Usage: python3 benchmarks/trace_breakdown.py TRACE.json.gz [--output FILE]
Kinds: gemm (cuBLAS / cuBLASLt / nvjet), attention (cuDNN's SDPA, the Triton attention
kernels), norm, silu_mul, rotary, quantize, memset, copy, other. Per kind: ms, calls and the
share of the device's busy time; then the span from the first kernel to the last, the time
the device ran no kernel in it, and per kernel and grid (a layer's GEMMs apart) its calls in
order, split into their first and last quarters (`drift`: the last quarter's median call
over the first's: a GPU that slows down under a long step shows it as > 1)."""
import argparse
import collections
import gzip
import json
import statistics

KINDS = (("attention", ("sdpa", "flash", "_attention", "attn_fwd", "fmha")),
         ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma", "_mm_", "cublas")),
         ("norm", ("rms_norm",)), ("silu_mul", ("silu",)), ("rotary", ("rotary",)),
         ("quantize", ("quantize",)), ("memset", ("memset",)), ("copy", ("memcpy", "copy")))


def kind_of(name: str) -> str:
    lower = name.lower()
    for kind, parts in KINDS:
        if any(part in lower for part in parts):
            return kind
    return "other"


def device_events(trace: dict) -> list[dict]:
    return sorted((e for e in trace["traceEvents"]
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
                  key=lambda e: e["ts"])


def breakdown(events: list[dict]) -> dict:
    by_kind = collections.defaultdict(list)
    for e in events:
        by_kind[kind_of(e["name"])].append(e["dur"] / 1e3)
    busy = sum(e["dur"] for e in events) / 1e3
    span = (max(e["ts"] + e["dur"] for e in events) - events[0]["ts"]) / 1e3
    union, end = 0.0, events[0]["ts"]
    for e in events:
        start, stop = max(e["ts"], end), e["ts"] + e["dur"]
        if stop > start:
            union, end = union + (stop - start) / 1e3, stop
    kinds = {kind: dict(ms=round(sum(ms), 3), calls=len(ms), share=round(sum(ms) / busy, 4))
             for kind, ms in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))}
    names = collections.Counter()
    for e in events:
        names[e["name"][:100]] += e["dur"] / 1e3
    return dict(busy_ms=round(busy, 3), span_ms=round(span, 3), idle_ms=round(span - union, 3),
                kinds=kinds, top=[(n, round(ms, 3)) for n, ms in names.most_common(12)],
                drift=drift(events))


def drift(events: list[dict], layers: int = 32) -> list[dict]:
    """Per kernel and grid run once or k times a layer (k * `layers` calls): each of its
    k calls of a layer (a persistent GEMM's shapes share a grid) as a series over the
    layers, with the median of its first quarter, of its last, and their ratio."""
    calls = collections.defaultdict(list)
    for e in events:
        calls[e["name"][:60], str(e.get("args", {}).get("grid"))].append(e["dur"] / 1e3)
    rows = []
    for (name, grid), ms in calls.items():
        if len(ms) % layers or sum(ms) < 0.01 * sum(e["dur"] for e in events) / 1e3:
            continue
        per_layer = len(ms) // layers
        for i in range(per_layer):
            series = ms[i::per_layer]
            quarter = layers // 4
            first, last = statistics.median(series[:quarter]), statistics.median(series[-quarter:])
            rows.append(dict(kernel=name, grid=grid, call_in_layer=i, first_ms=round(first, 4),
                             last_ms=round(last, 4), drift=round(last / first, 4)))
    return sorted(rows, key=lambda r: -r["first_ms"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        result = breakdown(device_events(json.load(f)))
    print(json.dumps(result, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
