#!/usr/bin/env bash
# Issue 60, FP8 decode at 16-64 rows (helper fp8w64): 8B-shape FP8 decode (b16, b64, context
# 1024, CUDA graphs, PDL as by default) with the TMA GEMM configs measured (this tree) and
# without them (this tree with PARASHIFT_FP8_TMA=0: today's candidates, the same kernels'
# compiled code, so the second run compiles next to nothing; a cold start compiles ~150
# kernels, ~80 s), then $BEFORE's tree where BUDGET_S (default 150) leaves 100 s; then a
# summary: each run's step ms and fraction of the floor, the ratios by batch and the FP8 GEMM
# kernels each run chose at 16-64 rows. JSON and logs to $OUT/decode_<run>.{json,log}.
# Usage (repository root; $BEFORE unpacked there): OUT=dir [BEFORE=.before] [BUDGET_S=150]
#        bash scripts/gpu_fp8w64_ab.sh
set -u
here=$(pwd); budget=${BUDGET_S:-150}
mkdir -p "$OUT"
decode() {  # run name, tree, PARASHIFT_FP8_TMA
  local start=$SECONDS left=$((budget - SECONDS))
  [ $left -lt 20 ] && { echo "[decode $1 skipped: $SECONDS s used]"; return; }
  (cd "$2" && PYTHONPATH="$2" PARASHIFT_FP8_TMA=$3 timeout -k 3 $left python3 \
    benchmarks/decode_throughput.py --model "$here/benchmarks/shapes/llama-3.1-8b.json" \
    --batch-sizes 16 64 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
    --output "$OUT/decode_$1.json" > "$OUT/decode_$1.log" 2>&1)
  echo "[decode $1: rc=$? $((SECONDS - start)) s]"
}
decode tma "$here" 1
decode notma "$here" 0
if [ -n "${BEFORE:-}" ] && [ $((budget - SECONDS)) -ge 100 ]; then decode before "$here/$BEFORE" 1
else echo "[decode before skipped: $SECONDS s used]"; fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
step = {}  # run -> {batch: step ms}
for path in sorted(glob.glob(f"{out}/decode_*.json")):
    doc, run = json.load(open(path)), os.path.basename(path)[7:-5]
    print(f"{run:6s}", " | ".join(f"b{r['batch']} {r['step_ms']:.3f} ms {r['fraction_of_floor']:.3f}"
                                  f" of floor" for r in doc["rows"]))
    print("   chosen:", "; ".join(f"{c['rows_up_to']}x{c['weight']}: {c['kernel']}"
                                  for c in doc.get("fp8_gemm", []) if c["rows_up_to"] >= 16))
    step[run] = {r["batch"]: r["step_ms"] for r in doc["rows"]}
for base in ("notma", "before"):
    for batch, ms in sorted(step.get("tma", {}).items()):
        if batch in step.get(base, {}):
            print(f"b{batch}: {base} {step[base][batch]:.3f} ms, tma {ms:.3f} ms: "
                  f"{step[base][batch] / ms:.3f}x")
PY
