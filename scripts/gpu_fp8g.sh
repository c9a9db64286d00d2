#!/usr/bin/env bash
# Helper fp8g (issue 60): the 8B FP8 decode at one row, the GEMM side, on one H200. The
# STEPS (default "tests chain silu decode configs sweep"), in order, each under `timeout`
# within BUDGET_S (default 200) seconds, results to $OUT as they come:
#   tests: TESTS (default the L2 prefetch's GPU tests: the kernel; an engine's tokens with it
#      and without);
#   chain: benchmarks/l2_prefetch_chain.py, the 8B's 32 FP8 decode layers at one row as the
#      engine runs them, CHAIN_VARIANTS (the first the reference);
#   silu: benchmarks/decode_chain.py, FP8 b1, SiLU-and-mul in the gate_up GEMV against not;
#   decode: one FP8 engine at b1, its graphs captured again under each of DECODE_VARIANTS
#      ("auto", the default, in it: the chain step's DECODE_BEST (2) fastest variants),
#      DECODE_ROUNDS interleaved rounds, each variant's kernels profiled in its first;
#   decode_bf16: the same in bf16 against DECODE_BF16_VARIANTS (default the GEMV's weight
#      loads without the evict-first hint), not profiled;
#   configs: benchmarks/fp8_chain_configs.py, each projection's 4 fastest configs alone forced
#      in turn in the 32-layer chain (CONFIGS_SETTINGS, default PARASHIFT_GEMM_TIMING=chain);
#   sweep: benchmarks/fp8_gemm_sweep.py at one row, given the rows in E4M3, in the chain:
#      the GEMV's configs and the one-row TMA candidates (--kernels b1).
# Usage: OUT=dir [BUDGET_S=200] [STEPS="..."] [TESTS="..."] [CHAIN_VARIANTS="..."]
#   [DECODE_VARIANTS="..."] [DECODE_BF16_VARIANTS="..."] [DECODE_ROUNDS=3] [DECODE_BEST=2]
#   [CHAIN_REPEATS=11] [TESTS_S=15 CHAIN_S=50 SILU_S=30 DECODE_S=95 DECODE_BF16_S=60
#   CONFIGS_S=45 SWEEP_S=50: each step's usual seconds, as scripts/budget_step.sh takes them]
#   bash scripts/gpu_fp8g.sh
set -u
: "${OUT:?an output folder}"
out=$OUT budget=${BUDGET_S:-200}
source scripts/budget_step.sh
run() { budget_step "$@" | tee -a "$out/summary.log"; }  # run NAME NEED COMMAND...
step_tests() {
  # shellcheck disable=SC2086
  run tests ${TESTS_S:-15} env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x \
    -p no:cacheprovider ${TESTS:-tests/kernels/test_l2_prefetch.py tests/layers/test_l2_prefetch.py}
}
step_chain() {
  # shellcheck disable=SC2086
  run chain ${CHAIN_S:-50} python3 benchmarks/l2_prefetch_chain.py --weights fp8 --batch-sizes 1 \
    --layers 32 --repeats "${CHAIN_REPEATS:-11}" --no-dot-configs --output "$out/chain.json" \
    --variants ${CHAIN_VARIANTS:-PARASHIFT_L2_PREFETCH=1 PARASHIFT_L2_PREFETCH_MB=qkv:16/o:8 \
    PARASHIFT_L2_PREFETCH=0}
}
chain_best() {  # the chain's N fastest variants but its first (reference), as graph variants
  python3 -c 'import json, sys
row = json.load(open(sys.argv[1]))["rows"][0]["variants"]
names = sorted(list(row)[1:], key=lambda v: row[v]["us_per_layer"])[:int(sys.argv[2])]
print(" ".join(v for v in names if "=" in v))' "$out/chain.json" "$1"
}
decode_variants() {  # DECODE_VARIANTS with "auto" replaced by the chain's fastest
  local v result=""
  for v in ${DECODE_VARIANTS:-auto}; do
    [ "$v" = auto ] && v=$(chain_best "${DECODE_BEST:-2}" 2>/dev/null)
    result="$result $v"
  done
  echo $result
}
step_decode() {
  local variants; variants=$(decode_variants)
  [ -n "$variants" ] || { echo "[decode skipped: no variants]" | tee -a "$out/summary.log"; return; }
  # shellcheck disable=SC2086
  run decode ${DECODE_S:-95} python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 \
    --decode-steps 32 --cuda-graphs --quantization fp8 --no-dot-configs \
    --rounds "${DECODE_ROUNDS:-3}" --graph-variants $variants \
    --profile --profile-variants default $variants --output "$out/decode.json"
}
step_decode_bf16() {
  # shellcheck disable=SC2086
  run decode_bf16 ${DECODE_BF16_S:-60} python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 \
    --decode-steps 32 --cuda-graphs --rounds "${DECODE_ROUNDS:-3}" \
    --graph-variants ${DECODE_BF16_VARIANTS:-PARASHIFT_GEMV_EVICT_FIRST=0} \
    --output "$out/decode_bf16.json"
}
step_silu() {
  run silu ${SILU_S:-30} python3 benchmarks/decode_chain.py --weights fp8 --batch-sizes 1 \
    --layers 32 --repeats 15 --no-dot-configs --variants chain chain_silu_gate_up \
    --output "$out/silu_chain.json"
}
step_configs() {
  run configs ${CONFIGS_S:-45} python3 benchmarks/fp8_chain_configs.py --layers 32 --repeats 11 \
    --top 4 --no-dot-configs --settings "${CONFIGS_SETTINGS:-PARASHIFT_GEMM_TIMING=chain}" \
    --output "$out/configs.json"
}
step_sweep() {
  run sweep ${SWEEP_S:-50} python3 benchmarks/fp8_gemm_sweep.py --rows 1 --x-fp8 --chain \
    --kernels b1 --projections gate_up qkv down --workers 14 --output "$out/sweep_b1.json"
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt" 2>&1
for step in ${STEPS:-tests chain silu decode configs sweep}; do
  "step_$step"
done
echo "total $SECONDS s" | tee -a "$out/summary.log"
