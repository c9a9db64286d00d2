#!/usr/bin/env bash
# Issues 60/61: prefill at 512 and 4,096 tokens on ONE H200 (8B shape), bf16 and FP8, this
# tree against the one in $BEFORE (a `git archive` of main before the change), interleaved:
# FP8 after, FP8 before, bf16 before, bf16 after (what BUDGET_S leaves out last: a FP8 run
# takes ~50 s with its GEMM choices and graphs, a bf16 run ~35 s; GRAPHS=0 runs without CUDA
# graphs, ~30 and ~25 s: the 512-token prompt then runs eagerly too). A summary at the end (FP8
# against bf16 of the same tree, after against before); JSON and logs to $OUT/<step>.{json,log}.
# FAST=1 adds this tree's FP8 with PARASHIFT_FP8_FAST_ACCUM=1 (order: FP8 after, bf16 after, FP8
# after_fast, FP8 before, bf16 before).
# Usage: OUT=dir BEFORE=.before [BUDGET_S=150] [LENS="512 4096"] [GRAPHS=0] [FAST=1] \
#   bash scripts/gpu_fp8pf_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-150}
here=$(pwd); before=${BEFORE:?the earlier tree}
source scripts/budget_step.sh
run() {  # tree (after, before, or after_fast: this tree with PARASHIFT_FP8_FAST_ACCUM=1), dtype, seconds
  local tree=$1 dtype=$2 need=$3 dir=$here quant=() env=()
  [ "$tree" = before ] && dir=$here/$before
  [ "$tree" = after_fast ] && env=(PARASHIFT_FP8_FAST_ACCUM=1)
  [ "$dtype" = fp8 ] && quant=(--quantization fp8)
  [ "${GRAPHS:-1}" = 0 ] && quant+=(--no-cuda-graphs)
  (cd "$dir" && STEP_DIR=$OUT budget_step "prefill_${dtype}_$tree" "$need" env "${env[@]}" \
    python3 benchmarks/prefill_throughput.py --model "$here/benchmarks/shapes/llama-3.1-8b.json" \
    --prompt-lens ${LENS:-512 4096} --repeats 5 "${quant[@]}" \
    --output "$OUT/prefill_${dtype}_$tree.json")
}
if [ "${GRAPHS:-1}" = 0 ]; then fp8_s=30 bf16_s=25; else fp8_s=50 bf16_s=35; fi
if [ "${FAST:-0}" = 1 ]; then  # FP8's fast accumulation measured, bf16 before left to the budget
  run after fp8 $fp8_s; run after bf16 $bf16_s; run after_fast fp8 $fp8_s; run before fp8 $fp8_s
  run before bf16 $bf16_s
else
  run after fp8 $fp8_s; run before fp8 $fp8_s; run before bf16 $bf16_s; run after bf16 $bf16_s
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def rows(name):
    path = f"{out}/{name}.json"
    return {r["prompt_len"]: r for r in json.load(open(path))["rows"]} if os.path.exists(path) else {}
runs = {(d, t): rows(f"prefill_{d}_{t}") for d in ("fp8", "bf16")
        for t in ("before", "after", "after_fast")}
for length in sorted({n for r in runs.values() for n in r}):
    line = [f"{length:6d} tokens:"]
    for (d, t), r in runs.items():
        if length in r:
            line.append(f"{d} {t} {r[length]['step_ms']:.2f} ms ({r[length]['fraction_of_floor']:.3f} of floor)")
    for t in ("before", "after", "after_fast"):
        f, b = runs["fp8", t].get(length), runs["bf16", "after" if t == "after_fast" else t].get(length)
        if f and b:
            line.append(f"fp8/bf16 {t} {b['step_ms'] / f['step_ms']:.3f}x")
    print(" | ".join(line))
PY
