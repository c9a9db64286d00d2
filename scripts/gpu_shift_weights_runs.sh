#!/usr/bin/env bash
# Shift weights on nvidia-h200-x2, JSON to $OUT: the SP2 / shift-plan crossover
# (benchmarks/shift_crossover.py: decode steps of 1..512 sequences at context 1024 and
# 1024/2048-token prefills, each timed under both plans) once per --shift-weights mode:
# `reorder` (the default: base rows permuted so each shift shard is one view, one GEMM per
# projection, no extra memory), `slice` (views, 3 or 2 GEMMs per fused projection) and
# `separate` (a contiguous copy, + w/(SP*TP) per rank). Then, optionally:
# - TPOT=1: benchmarks/plans.py for tp2, sp2 and shift2 (shift2 under the default weights,
#   reorder) in one run, the issue's comparison (Shift's TPOT against TP=2's, its TTFT
#   against SP=2's); PLANS_ARGS adds flags (default: 20 interactive, 256 batch requests);
# - a SHIFT_THRESHOLD argument: the bursty workload under Shift with `reorder` weights.
# Usage: OUT=dir [MODES="reorder slice separate"] [TPOT=1] \
#        bash scripts/gpu_shift_weights_runs.sh MODEL_JSON [SHIFT_THRESHOLD]
# e.g.   OUT=out TPOT=1 bash scripts/gpu_shift_weights_runs.sh benchmarks/shapes/llama-3.1-8b.json
set -u
model=${1:?model json}; threshold=${2:-}
: "${OUT:?set OUT to a folder}"
mkdir -p "$OUT"
name=$(basename "$model" .json)
for weights in ${MODES:-reorder slice separate}; do
  python3 benchmarks/shift_crossover.py --model "$model" -sp 2 --shift-weights "$weights" \
    --tokens 1 8 64 256 512 --prefill-tokens 1024 2048 --steps 6 \
    --output "$OUT/crossover_${name}_$weights.json" 2>&1 | grep -E '^\{|suggested|shift weights'
done
if [ "${TPOT:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  python3 benchmarks/plans.py --model "$model" --plans tp2 sp2 shift2 \
    ${PLANS_ARGS:---interactive-requests 20 --batch-requests 256} \
    --output "$OUT/plans_${name}_reorder.json" 2>&1 | grep -vE 'WARNING|^\s*$' | tail -20
fi
if [ -n "$threshold" ]; then
  bash benchmarks/serve_workload.sh "$OUT/bursty-shift-reorder" bursty "--time-scale 0.05" "$model" \
    --max-model-len 8192 -sp 2 --parallel-policy shift --shift-threshold "$threshold" \
    --shift-weights reorder 2>&1 | grep -iE "median|peak|completed|error"
  rm -f "$OUT/bursty-shift-reorder/server.log"
fi
