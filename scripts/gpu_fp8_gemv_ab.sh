#!/usr/bin/env bash
# Issue 60, FP8 decode at batch 1-4: 8B-shape FP8 decode (b1, b4, b64) of this tree against
# $BEFORE's, interleaved twice (the second round runs this tree first), then this tree's FP8
# GEMM micro-bench at rows 1 and 4 if time is left; a summary at the end. Rounds and the
# micro-bench are skipped once the call nears BUDGET_S (default 330) seconds.
# JSON and logs to $OUT/decode_<tree>_<round>.{json,log} and $OUT/fp8_gemm_rows_1_4.{json,log}.
# Usage: OUT=dir BEFORE=.before [BUDGET_S=330] bash scripts/gpu_fp8_gemv_ab.sh
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}; budget=${BUDGET_S:-330}
decode() {  # tree, round
  local dir=$here; [ "$1" = before ] && dir=$here/$before
  local start=$SECONDS
  (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/decode_throughput.py \
    --model "$here/benchmarks/shapes/llama-3.1-8b.json" --batch-sizes 1 4 64 --context 1024 \
    --decode-steps 32 --quantization fp8 --output "$OUT/decode_$1_$2.json" \
    > "$OUT/decode_$1_$2.log" 2>&1)
  echo "[decode $1 round $2: rc=$? $((SECONDS - start)) s]"
}
decode before 1
decode after 1
if [ $SECONDS -lt $((budget - 150)) ]; then decode after 2; decode before 2
else echo "[round 2 skipped: $SECONDS s used]"; fi
if [ $SECONDS -lt $((budget - 60)) ]; then
  start=$SECONDS
  PYTHONPATH="$here" timeout $((budget - SECONDS)) python3 benchmarks/fp8_gemm.py --rows 1 4 \
    --output "$OUT/fp8_gemm_rows_1_4.json" > "$OUT/fp8_gemm_rows_1_4.log" 2>&1
  echo "[fp8_gemm micro-bench: rc=$? $((SECONDS - start)) s]"
else echo "[micro-bench skipped: $SECONDS s used]"; fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(f"{out}/decode_*.json")):
    doc = json.load(open(path))
    rows = " | ".join(f"b{r['batch']} {r['step_ms']:.2f} ms {r['fraction_of_floor']:.2f} of floor"
                      for r in doc["rows"])
    print(f"{os.path.basename(path)[:-5]:18s} {rows}")
    if "after" in path:
        print("   chosen:", "; ".join(f"{c['rows_up_to']}x{c['weight']}: {c['kernel']}"
                                      for c in doc.get("fp8_gemm", []) if c["rows_up_to"] <= 4))
step = {}  # (tree, batch) -> step ms of each round
for path in glob.glob(f"{out}/decode_*.json"):
    tree = os.path.basename(path).split("_")[1]
    for r in json.load(open(path))["rows"]:
        step.setdefault((tree, r["batch"]), []).append(r["step_ms"])
for batch in sorted({b for _, b in step}):
    b, a = step.get(("before", batch)), step.get(("after", batch))
    if a and b:
        print(f"b{batch}: before {min(b):.3f} ms, after {min(a):.3f} ms (best of rounds): "
              f"{min(b) / min(a):.3f}x")
log = f"{out}/fp8_gemm_rows_1_4.log"
if os.path.exists(log):
    for line in open(log):
        if line.startswith("{"):
            r = json.loads(line)
            print(f"gemm {r['proj']:8s} rows {r['rows']}: bf16 {r['bf16_us']} us, cuBLASLt "
                  f"{r['scaled_mm_us']} us, best triton {r.get('triton_us')} us "
                  f"({r.get('triton_config')}), best gemv {r.get('gemv_us')} us, "
                  f"{r['of_fp8_floor']} of FP8 floor")
PY
