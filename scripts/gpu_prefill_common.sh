# Sourced by gpu_prefill_mid.sh and gpu_prefill_second.sh after `set -u`: checks $OUT, sets
# the GPU, $budget (BUDGET_S, 235 by default) and $EIGHT_B, sources budget_step.sh, and starts
# nvidia-smi writing each GPU's SM and memory clocks, power and its limit, temperature and
# the clock-event reasons (0x4: the software power cap) every 100 ms into $OUT/smi.csv (its
# pid in $clock_sampler, for the caller to end). `step NAME ...` notes the step's start in the
# same clock ($OUT/marks) and runs budget_step.
: "${OUT:?a folder for the results}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
clock_reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$clock_reasons --format=csv > /dev/null 2>&1 \
  || clock_reasons=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,$clock_reasons \
  --format=csv -lms 100 > "$OUT/smi.csv" 2> "$OUT/smi.err" &
clock_sampler=$!
step() { echo "$1 $(date '+%Y/%m/%d %H:%M:%S.%N')" >> "$OUT/marks"; budget_step "$@"; }
