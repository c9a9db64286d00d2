# Sourced by gpu_prefill_mid.sh and gpu_prefill_second.sh: `start_clock_samples` has
# nvidia-smi write each GPU's SM and memory clocks, power and its limit, temperature and the
# clock-event reasons (0x4: the software power cap)
# every 100 ms into $OUT/smi.csv (its pid in $clock_sampler, for the caller to end); `step
# NAME ...` notes the step's start in the same clock ($OUT/marks) and runs budget_step.
start_clock_samples() {
  local reasons=clocks_event_reasons.active
  nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,$reasons \
    --format=csv -lms 100 > "$OUT/smi.csv" 2> "$OUT/smi.err" &
  clock_sampler=$!
}
step() { echo "$1 $(date '+%Y/%m/%d %H:%M:%S.%N')" >> "$OUT/marks"; budget_step "$@"; }
