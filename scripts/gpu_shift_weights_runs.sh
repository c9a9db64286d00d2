#!/usr/bin/env bash
# Issue 4's remaining runs on nvidia-h200-x2, JSON to $OUT: the SP2 / shift-plan crossover
# with `separate` and with `slice` shift weights (the step times of both; decode batches kept
# whole since 2026-11-22), then the bursty workload under Shift with `slice` weights (no extra
# weight memory, so the KV pool of the TP=2 plan's size).
# Usage: OUT=dir bash scripts/gpu_shift_weights_runs.sh MODEL_JSON SHIFT_THRESHOLD
set -u
model=${1:?model json}; threshold=${2:?shift threshold}
name=$(basename "$model" .json)
for weights in separate slice; do
  python3 benchmarks/shift_crossover.py --model "$model" -sp 2 --shift-weights $weights \
    --tokens 1 8 64 256 512 --prefill-tokens 1024 2048 --steps 6 \
    --output "$OUT/crossover_${name}_$weights.json" 2>&1 | grep -E '^\{|suggested|shift weights'
done
bash benchmarks/serve_workload.sh "$OUT/bursty-shift-slice" bursty "--time-scale 0.05" "$model" \
  --max-model-len 8192 -sp 2 --parallel-policy shift --shift-threshold "$threshold" \
  --shift-weights slice 2>&1 | grep -iE "median|peak|completed|error"
rm -f "$OUT/bursty-shift-slice/server.log"
