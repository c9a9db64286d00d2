"""The summary of scripts/gpu_moe_schedule_ab.sh's folder: the sweep's fastest rows per GEMM
and schedule, each variant's 4,096-token step against its floor, and the profiled step's
kernels by kind against each kind's floor (FLOPs at the matrix rate, bytes at the copy
rate; Qwen3-30B-A3B at 4,096 tokens, one GPU).

Usage: python3 benchmarks/moe_schedule_summary.py OUT_DIR [--model shape.json] [--tokens 4096]"""
import argparse
import json
import os

MATRIX_RATE = 788e12  # H200 dense bf16, ../shared/workloads.md
COPY_RATE = 4.27e12  # H200 HBM bytes/s, benchmarks/cost_profiles.py's ceiling
# kind: the kernel names' pieces it takes (first match wins; CPU-side aten:: rows and the
# runtime's calls are not kernels)
KINDS = [("experts gate_up+SiLU", ("_gate_up_silu_kernel",)),
         ("experts down", ("_grouped_gemm_kernel",)),
         ("top-k sum", ("_topk_sum_kernel",)),
         ("routing and pair sort", ("_place_pairs", "_count_pairs", "_sort_pairs", "_route",
                                    "router")),
         ("attention", ("sdpa", "flash", "attention", "fmha")),
         ("dense GEMMs", ("nvjet", "gemm", "xmma", "cutlass")),
         ("norms", ("rms_norm",)),
         ("rotary", ("rotary",)),
         ("copies", ("Memcpy", "copy", "Memset"))]


def kind_of(name: str) -> str | None:
    if name.startswith(("aten::", "cuLaunch", "cuda")):
        return None
    for kind, pieces in KINDS:
        if any(piece.lower() in name.lower() for piece in pieces):
            return kind
    return "other"


def floors_ms(cfg: dict, tokens: int) -> dict:
    """Each kind's floor in ms: the larger of its FLOPs at the matrix rate and its bytes at
    the copy rate (bf16; the experts' weights read once, activations once each way)."""
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    inter, experts, k = cfg["moe_intermediate_size"], cfg["num_experts"], cfg["num_experts_per_tok"]
    heads, kv_heads, head_dim = (cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                 cfg["head_dim"])
    pairs = tokens * k
    qkv = (heads + 2 * kv_heads) * head_dim

    def most(flops, nbytes):
        return layers * max(flops / MATRIX_RATE, nbytes / COPY_RATE) * 1e3
    return {
        "experts gate_up+SiLU": most(2 * pairs * hidden * 2 * inter,
                                     2 * (experts * 2 * inter * hidden + tokens * hidden
                                          + pairs * inter)),
        "experts down": most(2 * pairs * inter * hidden,
                             2 * (experts * hidden * inter + pairs * inter + pairs * hidden)),
        "top-k sum": most(0, 2 * (pairs * hidden + tokens * hidden)),
        "attention": most(2 * 2 * heads * head_dim * tokens ** 2 / 2,
                          2 * tokens * (2 * heads + 2 * kv_heads) * head_dim),
        "dense GEMMs": most(2 * tokens * hidden * (qkv + heads * head_dim + experts),
                            2 * hidden * (qkv + heads * head_dim + experts)),
        "norms": most(0, 2 * tokens * (4 * hidden + 2 * qkv)),
        "rotary": most(0, 2 * 2 * tokens * (heads + kv_heads) * head_dim),
    }


def sweep_rows(out: str) -> dict | None:
    """moe_prefill.json, else the rows its log printed (a sweep stopped by its timeout)."""
    path, log = os.path.join(out, "moe_prefill.json"), os.path.join(out, "moe_prefill.log")
    if os.path.exists(path):
        return json.load(open(path))
    if not os.path.exists(log):
        return None
    rows = [json.loads(line) for line in open(log) if line.startswith("{")]
    return {"rows": rows, "best": None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--tokens", type=int, default=4096)
    args = p.parse_args()
    sweep = sweep_rows(args.out)
    if sweep:
        for gemm in sorted({r["gemm"] for r in sweep["rows"]}):
            timed = sorted((r for r in sweep["rows"] if r["gemm"] == gemm and r["ms"]),
                           key=lambda r: r["ms"])
            print(f"{gemm}: " + "; ".join(
                f"m{r.get('block_m')} {r.get('tiles')} {r.get('schedule')} {r['ms']:.3f} ms "
                f"{r.get('tflops') or r.get('fraction') or r.get('tbps')}"
                + (f" host {r['host_ms']} / synced {r.get('host_ms_synced')} ms"
                   if "host_ms" in r else "") for r in timed[:5]))
        print("best:", json.dumps(sweep.get("best")))
    variants_path = os.path.join(args.out, "variants.json")
    if not os.path.exists(variants_path):
        return
    rows = json.load(open(variants_path))["rows"]
    for r in rows:
        print(f"{r['variant']:10s} {r['prompt_len']:5d}: {r['step_ms']:8.2f} ms "
              f"({r['fraction_of_floor']} of {r['floor_ms']} ms); forward host "
              f"{r['forward_host_ms']} / device {r['forward_device_ms']} ms")
    for r in rows:
        if r.get("python_profile"):
            print(f"host (cProfile, inflated) of {r['variant']} {r['prompt_len']}: " + "; ".join(
                f"{where} {ms} ms ({calls})" for where, ms, calls in r["python_profile"][:15]))
    floors = floors_ms(json.load(open(args.model)), args.tokens)
    for r in rows:
        for prof in r.get("profile", []):
            by_kind: dict[str, list] = {}
            for name, ms, calls in prof.get("device_ms", []):
                kind = kind_of(name)
                if kind:
                    by_kind.setdefault(kind, [0.0, 0, []])
                    by_kind[kind][0] += ms
                    by_kind[kind][1] += calls
                    by_kind[kind][2].append(name[:40])
            print(f"breakdown of {r['variant']} {r['prompt_len']} (busy {prof.get('busy_ms')}):")
            for kind, (ms, calls, names) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
                floor = floors.get(kind)
                share = f"floor {floor:6.2f} ms ({floor / ms:.2f})" if floor else ""
                print(f"  {kind:22s} {ms:7.2f} ms {calls:5d} calls  {share}  {', '.join(names)}")


if __name__ == "__main__":
    main()
