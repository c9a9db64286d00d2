#!/usr/bin/env bash
# Issue 61 (MoE decode b1): Qwen3-30B-A3B decode b1 and b64 (context 1024, CUDA graphs,
# max-model-len 8192, 32 steps, PDL as default) of this tree against the one in $BEFORE, one
# GPU, each tree running its own benchmarks/decode_throughput.py; then, as time is left, this
# tree's b1 with a kernel profile. A step is skipped where 55 s (a run takes ~60-75 s) would
# pass BUDGET_S. JSON and logs to $OUT/<step>.{json,log}; a summary at the end.
# Usage: OUT=dir BEFORE=.before [BUDGET_S=150] [BATCHES="1 64"] [NEED_S=55] bash scripts/gpu_moe_b1_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-150}
here=$(pwd); before=${BEFORE:?the earlier tree}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)  # the runs start in their trees
S=$here/benchmarks/shapes/qwen3-30b-a3b.json
source scripts/budget_step.sh
decode() {  # name, tree directory, then more flags
  local name=$1 dir=$2; shift 2
  (cd "$dir" && budget_step "$name" "${NEED_S:-55}" python3 benchmarks/decode_throughput.py --model "$S" \
    --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs \
    --output "$OUT/$name.json" "$@")
}
STEP_DIR=$OUT decode before "$here/$before" --batch-sizes ${BATCHES:-1 64}
STEP_DIR=$OUT decode after "$here" --batch-sizes ${BATCHES:-1 64}
STEP_DIR=$OUT decode after_profile "$here" --batch-sizes 1 --profile
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
steps = {}
for name in ("before", "after", "after_profile"):
    path = f"{out}/{name}.json"
    for r in (json.load(open(path)) if os.path.exists(path) else {}).get("rows", []):
        steps[name, r["batch"]] = r["step_ms"]
        print(f"{name:13s} b{r['batch']}: {r['step_ms']:.3f} ms, {r['fraction_of_floor']:.3f} of "
              f"floor {r['floor_ms']:.3f} ms")
        top = (r.get("profile") or {}).get("top_kernels", [])[:14]
        if top:
            print("   top kernels:", "; ".join(f"{n[:40]} {t}" for n, t in top))
for batch in (1, 64):
    if ("before", batch) in steps and ("after", batch) in steps:
        print(f"b{batch}: before / after {steps['before', batch] / steps['after', batch]:.3f}x")
PY
