#!/usr/bin/env bash
# Session 43's last call (nvidia-h200-x2): this tree (the session's merges) against $BEFORE
# (main's tree before them), interleaved, each engine in a fresh process. GPU 0 (cores 1-15):
# 8B decode b1/b64, FP8 then bf16; GPU 1 (cores 16-31): Qwen3-30B-A3B decode
# b1/b64, then prefill 512/4,096 bf16 and FP8; then both GPUs: $BOTH (the mixed-graph A/B).
# Usage (repository root, $BEFORE unpacked there): OUT=dir BEFORE=.before [BUDGET_S=340]
#   [BOTH="command"] bash scripts/gpu_s43_final.sh
set -u
: "${OUT:?a folder for the results}"
here=$(pwd)
before=$here/${BEFORE:?the tree before, unpacked in the repository root}
budget=${BUDGET_S:-340}
S=$here/benchmarks/shapes
source scripts/budget_step.sh
export here before budget S OUT IN_TREE
tree() { [ "$1" = before ] && echo "$before" || echo "$here"; }
IN_TREE='cd "$1" && shift && PYTHONPATH="$(pwd):${SITE:-/tmp/site}" exec "$@"'  # bash -c "$IN_TREE" _ DIR COMMAND...
decode8b() {  # decode8b TREE WEIGHTS ROUND
  local quant=(); [ "$2" = fp8 ] && quant=(--quantization fp8)
  local need=60; [ "$2" = fp8 ] && need=100
  budget_step "dense_${2}_${1}_$3" $need bash -c "$IN_TREE" _ "$(tree $1)" python3 benchmarks/decode_throughput.py \
    --model "$S/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 --decode-steps 32 \
    --cuda-graphs ${quant[@]+"${quant[@]}"} --output "$OUT/gpu0/dense_${2}_${1}_$3.json"
}
moe() {  # moe TREE
  budget_step "moe_$1" 75 bash -c "$IN_TREE" _ "$(tree $1)" python3 benchmarks/decode_throughput.py \
    --model "$S/qwen3-30b-a3b.json" --batch-sizes 1 64 --max-model-len 8192 --decode-steps 32 \
    --cuda-graphs --output "$OUT/gpu1/moe_$1.json"
}
prefill() {  # prefill TREE WEIGHTS [NAME_SUFFIX ENV=VALUE]
  local quant=(); [ "$2" = fp8 ] && quant=(--quantization fp8)
  budget_step "prefill_${2}_$1${3:-}" 45 bash -c "$IN_TREE" _ "$(tree $1)" \
    env ${4:-PARASHIFT_NONE=0} python3 benchmarks/prefill_throughput.py \
    --model "$S/llama-3.1-8b.json" --prompt-lens 512 4096 --repeats 5 \
    ${quant[@]+"${quant[@]}"} --output "$OUT/gpu1/prefill_${2}_$1${3:-}.json"
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0 STEP_DIR=$OUT/gpu0
  decode8b before fp8 1; decode8b after fp8 1; decode8b after bf16 1; decode8b before bf16 1
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1 STEP_DIR=$OUT/gpu1
  moe before; moe after
  prefill after fp8; prefill after bf16; prefill after fp8 _fast PARASHIFT_FP8_FAST_ACCUM=1
  prefill before fp8; prefill before bf16
}
mkdir -p "$OUT/gpu0" "$OUT/gpu1"
(taskset -c 1-15 bash -c "$(declare -f); gpu0" > "$OUT/gpu0.log" 2>&1) &
(taskset -c 16-31 bash -c "$(declare -f); gpu1" > "$OUT/gpu1.log" 2>&1) &
wait
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
if [ -n "${BOTH:-}" ]; then
  mkdir -p "$OUT/both"; echo "== both $(date +%T)"
  (cd "$here" && OUT="$OUT/both" timeout 200 bash -c "$BOTH") > "$OUT/both.log" 2>&1
  echo "== both exit $? $(date +%T)"; tail -20 "$OUT/both.log" | cut -c1-300
fi
