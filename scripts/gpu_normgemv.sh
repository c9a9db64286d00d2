#!/usr/bin/env bash
# Helper normgemv (issue 61): the RMSNorm inside the next GEMV on one H200. The STEPS (default
# "tests chain decode more_tests"), in order, each under `timeout` within BUDGET_S (default
# 235) seconds, results to $OUT as they come:
#   tests: the new kernel's GPU tests (fp8_gemv's norm input);
#   chain: benchmarks/norm_gemv_chain.py: the 8B's decode kernels at one row, FP8 then bf16,
#      variants plain / silu / norm / norm_silu in one process, and the candidates' sweep;
#   decode: the engine's decode b1 for each of DECODE ("model:weights", default
#      "llama-3.1-8b:fp8"), PARASHIFT_NORM_IN_GEMV=1 then 0, DECODE_ROUNDS times (default 1);
#      skipped where the chain ran and fused no norm (the engine's choice would be the same);
#   more_tests: norm_gemv's measured choice, and the engine's greedy tokens with the fusion
#      against without (tiny model, bf16 and FP8).
# Usage: OUT=dir [BUDGET_S=235] [STEPS="..."] [DECODE="llama-3.1-8b:fp8 qwen3-30b-a3b:bf16"]
#   [DECODE_ROUNDS=1] bash scripts/gpu_normgemv.sh
set -u
out=${OUT:?an output folder}
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-235} - ($(date +%s) - start) )); }
run() {  # run NAME SECONDS CMD...: at most SECONDS, never past the budget
  local name=$1 want=$2; shift 2
  local limit; limit=$(left); [ "$limit" -gt "$want" ] && limit=$want
  if [ "$limit" -le 5 ]; then echo "[$name] skipped: budget spent" | tee -a "$out/summary.log"; return; fi
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "[$name] rc=$? in $(( $(date +%s) - t0 )) s (limit $limit)" | tee -a "$out/summary.log"
}
step_tests() {
  run tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernels/test_fp8_gemv.py -k "norm"
}
step_chain() {
  run chain 80 python3 benchmarks/norm_gemv_chain.py --weights fp8 bf16 --batch-sizes 1 \
    --layers 32 --repeats 11 --sweep --no-dot-configs --output "$out/chain.json"
}
fused_in_chain() {  # whether the chain's choices fused a norm anywhere (true without a chain)
  [ -f "$out/chain.json" ] || return 0
  python3 -c 'import json, sys; rows = json.load(open(sys.argv[1]))["rows"]
sys.exit(0 if any(c["kernel"] != "unfused" for r in rows for c in r["chosen"]["norm"]) else 1)' \
    "$out/chain.json"
}
step_decode() {
  local round spec model weights quant flag
  if ! fused_in_chain; then
    echo "[decode] skipped: the chain chose no fused norm" | tee -a "$out/summary.log"; return
  fi
  for round in $(seq "${DECODE_ROUNDS:-1}"); do
    for spec in ${DECODE:-llama-3.1-8b:fp8}; do
      model=${spec%%:*} weights=${spec##*:} quant=""
      [ "$weights" = fp8 ] && quant="--quantization fp8"
      for flag in 1 0; do  # a model's first run compiles what the chain did not
        run "decode_${model}_${weights}_norm${flag}_$round" $((round == 1 && flag ? 75 : 40)) \
          env PARASHIFT_NORM_IN_GEMV=$flag python3 benchmarks/decode_throughput.py \
          --model "benchmarks/shapes/$model.json" --batch-sizes 1 --context 1024 \
          --decode-steps 32 --cuda-graphs $quant \
          --output "$out/decode_${model}_${weights}_norm${flag}_$round.json"
      done
    done
  done
}
step_more_tests() {
  run more_tests 90 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernels/test_norm_gemv.py tests/layers/test_norm_gemv.py
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
for step in ${STEPS:-tests chain decode more_tests}; do
  "step_$step"
done
grep -h '"step_ms"' "$out"/decode_*.log 2>/dev/null | cut -c1-200 >> "$out/summary.log"
