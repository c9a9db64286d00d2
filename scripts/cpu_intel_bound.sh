#!/usr/bin/env bash
# Issue 61 item 5 on the quiet Intel host: the most the CPU path can gain over transformers
# `generate` with its GEMMs at their in-place speed and the rest at zero
# (benchmarks/cpu_gemm_bound.py), one core pair a lane (taskset, 2 threads), the cells of a lane
# one after another, the lanes side by side. $OUT gets bound_<dtype>_b<batch>.json and .log.
# Usage (repository root): OUT=dir [CELL_S=100] [LANES="0,1=float32:1,float32:16
#   2,3=bfloat16:1,bfloat16:16"] [BOUND_ARGS=...] bash scripts/cpu_intel_bound.sh
set -u
: "${OUT:?OUT=dir}"
mkdir -p "$OUT"
source scripts/quiet_cpu_env.sh
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
read -r -a lanes <<< "${LANES:-0,1=float32:1,float32:16 2,3=bfloat16:1,bfloat16:16}"
lane() {  # cores cells
  local cells
  IFS=, read -r -a cells <<< "$2"
  for cell in "${cells[@]}"; do
    local dtype=${cell%%:*} batch=${cell##*:}
    timeout "${CELL_S:-100}" taskset -c "$1" python3 benchmarks/cpu_gemm_bound.py --dtype "$dtype" \
      --batch "$batch" --threads 2 --deadline-s $((${CELL_S:-100} * 2 / 3)) ${BOUND_ARGS:-} --output "$OUT/bound_${dtype}_b$batch.json" \
      > "$OUT/bound_${dtype}_b$batch.log" 2>&1
    echo "bound $dtype b$batch rc $?" >> "$OUT/rcs"
  done
}
pids=()
for spec in "${lanes[@]}"; do
  lane "${spec%%=*}" "${spec#*=}" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
cat "$OUT/rcs"
grep -h '^{' "$OUT"/bound_*.log | cut -c1-1000
