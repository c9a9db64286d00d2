#!/usr/bin/env bash
# Issues 61 (item 2) and 60: Qwen3-30B-A3B decode at small batch with the small-batch expert
# GEMVs (kernels/moe_small.py) on and off (PARASHIFT_MOE_SMALL=1|0), on ONE GPU, in this
# order (what BUDGET_S leaves out last):
# 1. the GPU tests of the small path (compiled, bf16/fp16/fp32 and FP8, a CUDA graph);
# 2. the kernel micro-bench (benchmarks/moe_small.py): small path against the grouped GEMM at
#    1/2/8/16 tokens, bf16 and FP8 experts, µs and fraction of the touched-bytes floor at
#    4.8 TB/s, and the fastest tiles;
# 3. decode b1 and b64 (context 1024, CUDA graphs, max-model-len 8192, 32 steps), bf16: on
#    (with a kernel profile), then off at b1 (b64's 512 pairs never take the small path);
# 4. the same with --quantization fp8;
# 5. the skinny GEMM's GPU tests in bf16 (now with GEMV configs), the dense projections' choice
#    at 1/2/4 rows (benchmarks/skinny_gemm.py), and bf16 decode b1 without the skinny GEMV
#    configs (PARASHIFT_SKINNY_GEMV=0);
# 6. if time is left, bf16 and FP8 decode b1 with the micro-bench's fastest tiles at 1 token
#    (PARASHIFT_MOE_SMALL_TILES).
# A step is skipped where its usual time would pass BUDGET_S seconds (tests ~60, bench ~60,
# a decode run with b64 ~75, at b1 only ~50, the skinny tests and bench ~40 each); each gets
# at most twice its usual time. JSON and logs to $OUT/<step>.{json,log}; a summary at the end. From the
# repository root:
# Usage: OUT=dir [BUDGET_S=300] bash scripts/gpu_moe_small_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-300}
S=$(pwd)/benchmarks/shapes/qwen3-30b-a3b.json
source scripts/budget_step.sh
step() {  # name, PARASHIFT_MOE_SMALL, seconds it needs, then the command
  local name=$1 mode=$2 need=$3; shift 3
  budget_step "$name" "$need" env PARASHIFT_MOE_SMALL="$mode" "$@"
}
decode() {  # name, mode, seconds, then batch sizes and other flags; $EXTRA_ENV: more env
  local name=$1 mode=$2 need=$3; shift 3
  step "$name" "$mode" "$need" env ${EXTRA_ENV:-PARASHIFT_MOE_SMALL=$mode} python3 \
    benchmarks/decode_throughput.py --model "$S" --max-model-len 8192 --context 1024 \
    --decode-steps 32 --cuda-graphs --output "$OUT/$name.json" --batch-sizes "$@"
}
best_tiles() {  # the micro-bench's fastest tiles at 1 token for bf16 or fp8 experts
  python3 -c "import json,sys; r=[r for r in json.load(open(sys.argv[1]))['rows']
if r['tokens']==1 and r['experts']==sys.argv[2]]; print(r[0]['best_env'] if r else '')" \
    "$OUT/moe_small.json" "$1" 2>/dev/null
}
gpu_tests() {  # name, seconds, -k expression, then the tests
  local name=$1 need=$2 select=$3; shift 3
  step "$name" 1 "$need" env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider -k "not interpreted and ($select)" "$@"
}
gpu_tests kernel_tests 60 "cuda or tiles or switch or pairs" tests/kernels/test_moe_small.py
step moe_small 1 60 python3 benchmarks/moe_small.py --model "$S" --tokens 1 2 8 16 \
  --output "$OUT/moe_small.json"
decode decode_bf16_on 1 75 1 64 --profile
decode decode_bf16_off 0 50 1
decode decode_fp8_on 1 75 1 64 --quantization fp8 --profile
decode decode_fp8_off 0 50 1 --quantization fp8
gpu_tests skinny_tests 40 "bfloat16 or dispatch" tests/kernels/test_skinny_gemm.py
step skinny 1 40 python3 benchmarks/skinny_gemm.py --model "$S" --rows 1 2 4
EXTRA_ENV=PARASHIFT_SKINNY_GEMV=0 decode decode_bf16_nogemv 1 50 1
for kind in bf16 fp8; do
  tiles=$(best_tiles $kind); flag=""; [ $kind = fp8 ] && flag="--quantization fp8"
  [ -n "$tiles" ] && EXTRA_ENV=PARASHIFT_MOE_SMALL_TILES=$tiles decode decode_${kind}_tuned 1 50 1 $flag
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = f"{out}/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
for r in (load("moe_small") or {}).get("rows", []):
    print(f"kernels {r['experts']} {r['tokens']:2d} tokens: grouped {r['grouped_us']} us "
          f"({r['grouped_fraction']}), small {r['small_us']} us ({r['small_fraction']}), "
          f"best {r['best_us']} us ({r['best_fraction']}) tiles {r['best_env']}; floor "
          f"{r['floor_us']} us; max |small - grouped| {r['max_abs_diff_small_vs_grouped']:.3g}")
log = f"{out}/skinny.log"
for line in open(log) if os.path.exists(log) else []:
    if line.startswith("{"):
        r = json.loads(line)
        print(f"skinny {r['proj']:7s} {r['n']}x{r['k']} rows {r['rows']}: cuBLAS {r['cublas_us']} us"
              f" ({r['cublas_fraction']}), chosen {r['chosen']} ({r['chosen_fraction']})")
step = {}
for kind in ("bf16", "fp8"):
    for mode in ("on", "off", "tuned", "nogemv"):
        doc = load(f"decode_{kind}_{mode}")
        for r in (doc or {}).get("rows", []):
            step[kind, mode, r["batch"]] = r["step_ms"]
            print(f"decode {kind} {mode:5s} b{r['batch']}: {r['step_ms']:.3f} ms, "
                  f"{r['fraction_of_floor']:.3f} of floor {r['floor_ms']:.3f} ms")
            top = (r.get("profile") or {}).get("top_kernels", [])[:8]
            if top:
                print("   top kernels:", "; ".join(f"{n[:40]} {t}" for n, t in top))
        if doc and mode == "on":
            print("   skinny GEMM:", "; ".join(f"{c['rows']}x{c['weight']}: {c['kernel']}"
                                             for c in doc.get("skinny_gemm", [])))
    for mode in ("on", "tuned"):
        if (kind, "off", 1) in step and (kind, mode, 1) in step:
            print(f"decode {kind} b1: off / {mode} {step[kind, 'off', 1] / step[kind, mode, 1]:.3f}x"
                  " (> 1: the small path faster)")
    if (kind, "nogemv", 1) in step and (kind, "on", 1) in step:
        print(f"decode {kind} b1: skinny GEMV off / on "
              f"{step[kind, 'nogemv', 1] / step[kind, 'on', 1]:.3f}x (> 1: the GEMV configs faster)")
PY
