#!/usr/bin/env bash
# Issue 7's runs on nvidia-h200-x8 (8 GPUs), JSON to $OUT: the crossover of the Shift base
# plan against its shift plan (sets the threshold), the Figure 9 table, then the bursty and
# rates workloads for DP, TP and Shift over HTTP.
# Usage: OUT=dir bash scripts/gpu_shift8_runs.sh qwen|llama70 INTERACTIVE BATCH RATE_REQUESTS
# Qwen3-32B: DP=8, TP=8, SP=8, Shift over SP=8. Llama-3.1-70B (does not fit one GPU in bf16,
# nor SP=8's whole-model replicas): DP=4xTP=2, TP=8, SP=4xTP=2, Shift over SP=4xTP=2.
set -u
interactive=${2:-20}; batch=${3:-1000}; rate_requests=${4:-200}
case ${1:?qwen or llama70} in
  qwen) model=benchmarks/shapes/qwen3-32b.json; dp="-dp 8"; base="-sp 8"
        plans="dp8 tp8 sp8 shift-sp8" ;;
  llama70) model=benchmarks/shapes/llama-3.1-70b.json; dp="-dp 4 -tp 2"; base="-sp 4 -tp 2"
           plans="dp4tp2 tp8 sp4tp2 shift-sp4tp2" ;;
  *) echo "unknown model set $1" >&2; exit 2 ;;
esac
name=$(basename "$model" .json)
# shellcheck disable=SC2086
python3 benchmarks/shift_crossover.py --model "$model" $base --tokens 1 8 64 128 \
  --prefill-tokens 1024 2048 4096 --steps 6 --output "$OUT/crossover_$name.json" 2>&1 \
  | grep -E '^\{|suggested|shift weights'
threshold=$(python3 -c "import json; print(json.load(open('$OUT/crossover_$name.json'))['suggested_threshold'])")
# shellcheck disable=SC2086
python3 benchmarks/plans.py --model "$model" --plans $plans --interactive-requests "$interactive" \
  --batch-requests "$batch" --shift-threshold "$threshold" --output "$OUT/plans_$name.json" 2>&1 \
  | grep '^{'
for plan in dp tp shift; do
  case $plan in
    dp) flags=$dp ;; tp) flags="-tp 8" ;;
    shift) flags="$base --parallel-policy shift --shift-threshold $threshold" ;;
  esac
  for workload in bursty rates; do
    bench="--time-scale 0.2"
    [ $workload = rates ] && bench="--num-requests $rate_requests"
    # shellcheck disable=SC2086
    bash benchmarks/serve_workload.sh "$OUT/$workload-$plan" $workload "$bench" "$model" \
      --max-model-len 10240 $flags 2>&1 | grep -iE "median|peak|completed|rate|error"
    rm -f "$OUT/$workload-$plan/server.log"
  done
done
