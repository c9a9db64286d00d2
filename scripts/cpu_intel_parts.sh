#!/usr/bin/env bash
# Issue 61 item 5 on the quiet Intel host: where a CPU decode step's time goes, parashift
# beside transformers (benchmarks/cpu_step_parts.py: each module kind timed by forward hooks
# in decode calls), the four cells (fp32, bf16) x (batch 1, 16) side by side, each pinned to
# two cores of its own (taskset; 2 threads). $OUT gets parts_<dtype>_b<batch>.json and .log.
# Usage (repository root): OUT=dir [BUDGET_S=60] [CORES="0,1 2,3 4,5 6,7"]
#   [CELLS="float32:1 float32:16 bfloat16:1 bfloat16:16"] bash scripts/cpu_intel_parts.sh
set -u
: "${OUT:?OUT=dir}"
budget=${BUDGET_S:-60}
mkdir -p "$OUT"
source scripts/quiet_cpu_env.sh
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
read -r -a cores <<< "${CORES:-0,1 2,3 4,5 6,7}"
read -r -a cells <<< "${CELLS:-float32:1 float32:16 bfloat16:1 bfloat16:16}"
pids=()
for i in "${!cells[@]}"; do
  dtype=${cells[$i]%%:*} batch=${cells[$i]##*:}
  timeout "$budget" taskset -c "${cores[$i]}" python3 benchmarks/cpu_step_parts.py \
    --dtype "$dtype" --batch "$batch" --threads 2 --new-tokens 24 --repeats 2 \
    --output "$OUT/parts_${dtype}_b$batch.json" > "$OUT/parts_${dtype}_b$batch.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
grep -h '^parashift\|^transformers' "$OUT"/parts_*.log
