#!/usr/bin/env bash
# One run of benchmarks/recovery_under_load.py (issue 65 part 5), for the `faults` parts of
# gpu_x2_runs.sh and gpu_x4_runs.sh: the 8B shape in bf16, `chat` with its 400 requests sent
# at once and streamed, the worker of rank RANK SIGKILLed once a tenth of the output tokens
# came (early: a replacement, which may take as long as a start, 17-37 s, is then back while
# requests still run); its report in $OUT/faults_NAME.json, the summary and a one-line JSON
# in the log. The run ends within LIMIT seconds: the requests get half of it, the wait for
# the replaced group a fifth; a run cut by the limit writes no report.
#   OUT=dir bash scripts/gpu_faults.sh NAME RANK LIMIT ENGINE_FLAGS...
# FAULTS_MODEL replaces the shape and FAULTS_ARGS is appended (a flag's last value wins): a
# check of the flags on the CPU, e.g. FAULTS_MODEL=benchmarks/shapes/tiny-llama.json
# FAULTS_ARGS="--device cpu --dtype float32 --length-scale 0.05 --max-model-len 512" (400
# requests: 20 s on 2 cores)
set -u
: "${OUT:?a folder for the results}"
name=$1 rank=$2 limit=$3
shift 3
echo "-- faults_$name: kill rank $rank, $* (limit ${limit}s) $(date +%T)"
timeout -k 15 "$limit" python3 benchmarks/recovery_under_load.py \
  --model "${FAULTS_MODEL:-benchmarks/shapes/llama-3.1-8b.json}" --dtype bfloat16 \
  --max-model-len 4096 --workload chat --num-requests 400 --kill-rank "$rank" \
  --kill-at-share 0.1 --timeout-s $((limit / 2)) --recovery-wait-s $((limit / 5)) \
  --output "$OUT/faults_$name.json" "$@" ${FAULTS_ARGS:-}
echo "-- faults_$name exit $? $(date +%T)"
