#!/usr/bin/env bash
# Issue 61 (item 2): Qwen3-30B-A3B prefill on ONE GPU, the tree before ($BEFORE, default
# .before: `git archive 5ad0e89` unpacked there) against this one, in this order (what
# BUDGET_S leaves out last):
# 0. the GPU tests of the changed kernels (MoE prefill path, sort and routing, the per-head
#    RMSNorm and q/k norms, the cuDNN long-prompt route);
# 1. benchmarks/moe_prefill.py: one layer's experts at 4,096 tokens (32,768 pairs): the
#    grouped GEMMs' tiles swept (ms, TFLOP/s), the experts call unfused against the prefill
#    path (table tiles, swept tiles), the fastest tiles to $OUT/moe_prefill_tiles.json;
# 2. after: benchmarks/prefill_variants.py (prefill_throughput.py's timing, one engine) at
#    512 and 4096 tokens, --repeats 3, 4096 profiled (kernels, CUDA runtime calls, host/device
#    busy; the forward's Python under cProfile), then 4096 with PARASHIFT_PDL=0, the MoE
#    prefill path off (PARASHIFT_MOE_PREFILL=0), the swept tiles and cuDNN off;
# 3. before: the same but the two switches it lacks (the s42 profile of this tree, 140.8 ms
#    at 4096, is in benchmarks/results/raw/s42_profiles_fallback/ if the budget cuts it).
# Each row holds the forward's host issue time and device span and the allocator's retries.
# A step is skipped where its usual time would pass BUDGET_S seconds (tests ~60, bench ~55,
# a prefill run ~65-70); each gets at most twice its usual time. JSON and logs to
# $OUT/<step>.{json,log}; a summary at the end. From the repository root:
# Usage: OUT=dir [BUDGET_S=280] [BEFORE=.before] bash scripts/gpu_moe_prefill_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-280}
before=$(cd "${BEFORE:-.before}" 2>/dev/null && pwd)
S=$(pwd)/benchmarks/shapes/qwen3-30b-a3b.json
TILES=$OUT/moe_prefill_tiles.json
source scripts/budget_step.sh
variants() {  # name, seconds, PYTHONPATH, then the variants and flags
  local name=$1 need=$2 path=$3; shift 3
  budget_step "$name" "$need" env PYTHONPATH="$path" python3 benchmarks/prefill_variants.py \
    --model "$S" --prompt-lens 512 4096 --repeats 3 --output "$OUT/$name.json" --variants "$@"
}
budget_step gpu_tests 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider -k "not interpreted" tests/kernels/test_moe_prefill.py \
  tests/kernels/test_rmsnorm.py::test_heads_cuda tests/kernels/test_fused_moe.py::test_sort_cuda \
  tests/kernels/test_fused_moe.py::test_routing_cuda tests/layers/test_layernorm.py \
  tests/attention/test_cudnn_prefill.py::test_a_batch_of_only_long_prompts
budget_step moe_prefill 55 python3 benchmarks/moe_prefill.py --model "$S" --tokens 4096 \
  --output "$OUT/moe_prefill.json" --tiles-out "$TILES"
variants after 70 "$(pwd)" default pdl_off moe_prefill_off swept_tiles cudnn_off --profile \
  --python-profile --tiles "$TILES"
if [ -n "$before" ] && [ -d "$before/parashift" ]; then
  variants before 65 "$before" default pdl_off cudnn_off --profile --python-profile
else
  echo "[before skipped: no tree at ${BEFORE:-.before}]"
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = f"{out}/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
bench = load("moe_prefill")
for r in (bench or {}).get("rows", []):
    if r["gemm"].startswith("experts call"):
        print(f"{r['gemm']}: {r['ms']} ms ({r['fraction']} of {r['floor_ms']} ms), "
              f"max |diff| from unfused {r['max_abs_diff']:.3g}")
for gemm in ("gate_up+silu", "gate_up unfused", "down"):
    timed = sorted((r for r in (bench or {}).get("rows", []) if r["gemm"] == gemm
                    and r["ms"] is not None), key=lambda r: r["ms"])
    print(f"{gemm}: " + "; ".join(f"m{r['block_m']} {r['tiles']} {r['ms']:.3f} ms "
                                  f"{r['tflops']} TFLOP/s" for r in timed[:4]))
if bench:
    print("swept tiles:", json.dumps(bench.get("best")))
steps = {}
for tree in ("before", "after"):
    for r in (load(tree) or {}).get("rows", []):
        steps[tree, r["variant"], r["prompt_len"]] = r["step_ms"]
        print(f"{tree:6s} {r['variant']:15s} {r['prompt_len']:5d}: {r['step_ms']:8.2f} ms "
              f"({r['fraction_of_floor']} of {r['floor_ms']} ms); forward host "
              f"{r['forward_host_ms']} / device {r['forward_device_ms']} ms; allocator "
              f"{r['allocator']}")
        for p in r.get("profile", []):
            print("   busy:", p["busy_ms"])
            print("   kernels:", "; ".join(f"{n[:40]} {t} ({c})" for n, t, c in (p.get("device_ms") or p.get("host_ms", []))[:12]))
            print("   runtime calls:", "; ".join(f"{n} {t} ms ({c})"
                                                 for n, t, c in p.get("runtime_calls", [])))
        if r.get("python_profile"):
            print("   python (cProfile):", "; ".join(f"{w} {t} ms ({c})"
                                                     for w, t, c in r["python_profile"][:12]))
for length in (512, 4096):
    if ("before", "default", length) in steps and ("after", "default", length) in steps:
        b, a = steps["before", "default", length], steps["after", "default", length]
        print(f"prefill {length}: before {b:.2f} ms, after {a:.2f} ms, after / before {a / b:.3f}")
for tree in ("before", "after"):
    for variant in ("pdl_off", "moe_prefill_off", "swept_tiles", "cudnn_off"):
        if (tree, variant, 4096) in steps and (tree, "default", 4096) in steps:
            print(f"{tree} 4096: {variant} / default "
                  f"{steps[tree, variant, 4096] / steps[tree, 'default', 4096]:.3f}")
PY
