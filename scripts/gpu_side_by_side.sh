#!/usr/bin/env bash
# Up to two one-GPU scripts and one CPU script side by side on a two-GPU machine (nvidia-h200-x2):
# GPU0's on cores 8-15, GPU1's on cores 16-23, the CPU script on cores 0-7 (it pins its own cells),
# each with its own $OUT subfolder and log; then the summaries. From the repository root:
#   OUT=dir GPU0="BUDGET_S=250 BEFORE=.before bash scripts/gpu_moe_prefill_ab.sh" \
#   GPU1="BUDGET_S=250 BEFORE=.before bash scripts/gpu_fp8_decode_ab.sh" \
#   CPU="BEFORE=.before bash scripts/cpu_intel_ab.sh" bash scripts/gpu_side_by_side.sh
set -u
: "${OUT:?a folder for the results}"
side() {  # side NAME CUDA_DEVICES CORES COMMAND
  local name=$1 devices=$2 cores=$3 command=$4
  [ -n "$command" ] || return 0
  mkdir -p "$OUT/$name"
  echo "== $name: $command ($(date +%T))"
  CUDA_VISIBLE_DEVICES=$devices OUT="$OUT/$name" taskset -c "$cores" bash -c "$command" \
    > "$OUT/$name.log" 2>&1
  echo "== $name exit $? ($(date +%T))"
}
side gpu0 0 8-15 "${GPU0:-}" &
side gpu1 1 16-23 "${GPU1:-}" &
side cpu "" 0-7 "${CPU:-}" &
wait
for name in gpu0 gpu1 cpu; do
  [ -f "$OUT/$name.log" ] && { echo "== $name (last lines)"; tail -25 "$OUT/$name.log" | cut -c1-300; }
done
exit 0
