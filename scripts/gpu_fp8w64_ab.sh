#!/usr/bin/env bash
# Issue 60, FP8 decode at 16-64 rows (helper fp8w64): 8B-shape FP8 decode (b16, b64, context
# 1024, CUDA graphs, PDL as by default) of this tree against $BEFORE's, before first, then
# after, then (where BUDGET_S, default 150, leaves time) a second round after first; then a
# summary: each run's step ms and fraction of the floor, after/before by batch (best of
# rounds) and the FP8 GEMM kernels each tree chose at 16-64 rows.
# JSON and logs to $OUT/decode_<tree>_<round>.{json,log}.
# Usage (repository root; $BEFORE unpacked there): OUT=dir BEFORE=.before [BUDGET_S=150]
#        bash scripts/gpu_fp8w64_ab.sh
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}; budget=${BUDGET_S:-150}
mkdir -p "$OUT"
decode() {  # tree, round
  local dir=$here; [ "$1" = before ] && dir=$here/$before
  local start=$SECONDS
  (cd "$dir" && PYTHONPATH="$dir" timeout $(( budget - SECONDS > 5 ? budget - SECONDS : 5 )) python3 \
    benchmarks/decode_throughput.py --model "$here/benchmarks/shapes/llama-3.1-8b.json" \
    --batch-sizes 16 64 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
    --output "$OUT/decode_$1_$2.json" > "$OUT/decode_$1_$2.log" 2>&1)
  echo "[decode $1 round $2: rc=$? $((SECONDS - start)) s]"
}
decode before 1
decode after 1
if [ $SECONDS -lt $((budget - 90)) ]; then decode after 2; decode before 2
else echo "[round 2 skipped: $SECONDS s used]"; fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
step = {}  # (tree, batch) -> step ms of each round
for path in sorted(glob.glob(f"{out}/decode_*.json")):
    doc, tree = json.load(open(path)), os.path.basename(path).split("_")[1]
    print(f"{os.path.basename(path)[:-5]:16s}", " | ".join(
        f"b{r['batch']} {r['step_ms']:.3f} ms {r['fraction_of_floor']:.3f} of floor"
        for r in doc["rows"]))
    print("   chosen:", "; ".join(f"{c['rows_up_to']}x{c['weight']}: {c['kernel']}"
                                  for c in doc.get("fp8_gemm", []) if c["rows_up_to"] >= 16))
    for r in doc["rows"]:
        step.setdefault((tree, r["batch"]), []).append(r["step_ms"])
for batch in sorted({b for _, b in step}):
    b, a = step.get(("before", batch)), step.get(("after", batch))
    if a and b:
        print(f"b{batch}: before {min(b):.3f} ms, after {min(a):.3f} ms (best of rounds): "
              f"{min(b) / min(a):.3f}x")
PY
