#!/usr/bin/env bash
# (Helper l2pf's call script; the kinds other than bulk and the placements in the PDL chain
# were removed in session 51: its variants of them now set the budget only.)
# Helper l2pf (issues 60, 61): the next GEMMs' weights pulled into L2 while the small decode
# kernels run, on one H200. The STEPS (default "tests chain_fp8 chain_bf16 decode
# engine_tests"), in order, each a `budget_step` within BUDGET_S (default 235) seconds,
# results to $OUT as they come:
#   tests: the prefetch kernel's GPU tests (same bits in a graphed chain, spans of any size);
#   chain_fp8 / chain_bf16: benchmarks/l2_prefetch_chain.py: the 8B's 32 layers at one row,
#      the prefetch's variants (budgets) against off;
#   decode: the 8B engine's FP8 decode b1, off against DECODE_VARIANTS and the chain's fastest
#      variant where it beat off (graph variants, two rounds; the engine built with
#      PARASHIFT_L2_PREFETCH=0 set, so that its GEMMs have the hooks the variants switch on);
#   engine_tests: an engine's greedy tokens with the prefetches against without (tiny model);
#   profile (not by default): the engine's FP8 b1 kernels timed one by one with PDL off, o's
#      weight prefetched (qkv:16) on the side stream against none.
# Usage: OUT=dir [BUDGET_S=235] [STEPS="..."] [CHAIN_VARIANTS="..."] [CHAIN_REPEATS=11]
#   [DECODE_VARIANTS="NAME=VALUE[,...] ..."] [DECODE_ROUNDS=2] bash scripts/gpu_l2pf.sh
set -u
out=${OUT:?an output folder}
budget=${BUDGET_S:-235}
source "$(dirname "$0")/budget_step.sh"
step_tests() {
  budget_step tests 15 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernels/test_l2_prefetch.py
}
step_chain_fp8() {
  # shellcheck disable=SC2086
  budget_step chain_fp8 30 python3 benchmarks/l2_prefetch_chain.py --weights fp8 --batch-sizes 1 \
    --layers 32 --repeats "${CHAIN_REPEATS:-11}" --no-dot-configs --output "$out/chain_fp8.json" \
    ${CHAIN_VARIANTS:+--variants $CHAIN_VARIANTS}
}
step_chain_bf16() {
  budget_step chain_bf16 20 python3 benchmarks/l2_prefetch_chain.py --weights bf16 --batch-sizes 1 \
    --layers 32 --repeats 11 --output "$out/chain_bf16.json" --variants off \
    PARASHIFT_L2_PREFETCH=1 PARASHIFT_L2_PREFETCH_MB=qkv:16
}
best_chain_variant() {  # the FP8 chain's fastest variant settable in the engine, if it beat off
  [ -f "$out/chain_fp8.json" ] || return 0
  # shellcheck disable=SC2086
  python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["rows"][0]["variants"]
best = min(v, key=lambda n: v[n]["us_per_layer"])
ok = best not in ("off", *sys.argv[2:])
print(best if ok and v[best]["us_per_layer"] < v["off"]["us_per_layer"] else "")' \
    "$out/chain_fp8.json" ${DECODE_VARIANTS:-PARASHIFT_L2_PREFETCH=1}
}
step_decode() {
  local best; best=$(best_chain_variant)
  # shellcheck disable=SC2086
  budget_step decode 50 env PARASHIFT_L2_PREFETCH=0 python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 \
    --decode-steps 32 --cuda-graphs --quantization fp8 --no-dot-configs \
    --rounds "${DECODE_ROUNDS:-2}" \
    --graph-variants ${DECODE_VARIANTS:-PARASHIFT_L2_PREFETCH=1} ${best:+$best} \
    --output "$out/decode_fp8.json"
}
step_profile() {  # each kernel's time with PDL off (PDL stretches a kernel over its wait)
  local off=PARASHIFT_PDL=0 mb=PARASHIFT_L2_PREFETCH_MB=qkv:16
  local variants="$off $off,PARASHIFT_L2_PREFETCH=1,$mb"
  # shellcheck disable=SC2086
  budget_step profile 60 env PARASHIFT_L2_PREFETCH=0 python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 \
    --decode-steps 32 --cuda-graphs --quantization fp8 --no-dot-configs \
    --graph-variants $variants --profile --profile-variants $variants \
    --output "$out/profile_fp8.json"
}
step_engine_tests() {
  budget_step engine_tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x \
    -p no:cacheprovider tests/layers/test_l2_prefetch.py -k "fp8"
}
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$out/gpu.txt" 2>&1
for step in ${STEPS:-tests chain_fp8 chain_bf16 decode engine_tests}; do "step_$step"; done
echo "done in $SECONDS s"
