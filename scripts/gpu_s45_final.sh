#!/usr/bin/env bash
# Session 45's last call (nvidia-h200-x2): this tree (the session's merges) against $BEFORE
# (main's tree before them), interleaved, each engine in a fresh process. GPU 0 (cores 1-15):
# 8B FP8 decode b1/b64 in two rounds (after, before, after, before), a third after the tests
# where the budget is left; GPU 1 (cores 16-31):
# Qwen3-30B-A3B decode b1/b64 in two rounds; each lane then runs the GPU tests of the session's
# kernels ($GPU0_TESTS, then $GPU0_MORE_TESTS; $GPU1_TESTS and the engine's graph tests), then
# where the budget is left a third FP8 round (GPU 0) and 8B bf16 b1/b64 (GPU 1). Each tree's FP8 GEMM
# candidates are compiled first in parallel processes (fp8_gemm_sweep.py --warm-only) so the
# engines' start-up times nothing cold. Usage (repository root, $BEFORE unpacked there):
#   OUT=dir BEFORE=.before [BUDGET_S=540] [GPU0_TESTS=...] [GPU1_TESTS=...] bash scripts/gpu_s45_final.sh
set -u
: "${OUT:?a folder for the results}"
here=$(pwd)
before=$here/${BEFORE:?the tree before, unpacked in the repository root}
budget=${BUDGET_S:-540}
S=$here/benchmarks/shapes
source scripts/budget_step.sh
export here before budget S OUT IN_TREE
tree() { [ "$1" = before ] && echo "$before" || echo "$here"; }
IN_TREE='cd "$1" && shift && PYTHONPATH="$(pwd):${SITE:-/tmp/site}" exec "$@"'  # bash -c "$IN_TREE" _ DIR COMMAND...
warm() {  # warm TREE: the FP8 GEMM candidates an engine's start-up compiles, in 12 processes
  budget_step "warm_$1" 40 bash -c "$IN_TREE" _ "$(tree $1)" python3 benchmarks/fp8_gemm_sweep.py \
    --warm-only --workers 12
}
decode8b() {  # decode8b TREE WEIGHTS ROUND
  local quant=(); [ "$2" = fp8 ] && quant=(--quantization fp8)
  local need=55; [ "$2" = fp8 ] && need=70
  budget_step "dense_${2}_${1}_$3" $need bash -c "$IN_TREE" _ "$(tree $1)" python3 benchmarks/decode_throughput.py \
    --model "$S/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 --decode-steps 32 \
    --cuda-graphs ${quant[@]+"${quant[@]}"} --output "$STEP_DIR/dense_${2}_${1}_$3.json"
}
moe() {  # moe TREE ROUND
  budget_step "moe_$1_$2" 70 bash -c "$IN_TREE" _ "$(tree $1)" python3 benchmarks/decode_throughput.py \
    --model "$S/qwen3-30b-a3b.json" --batch-sizes 1 64 --max-model-len 8192 --decode-steps 32 \
    --cuda-graphs --output "$STEP_DIR/moe_$1_$2.json"
}
gputests() {  # gputests NAME TESTS...: the GPU tests of the session's kernels, this tree
  local name=$1; shift
  budget_step "gpu_tests_$name" 75 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider "$@"
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0 STEP_DIR=$OUT/gpu0
  warm after; warm before
  decode8b after fp8 1; decode8b before fp8 1; decode8b after fp8 2; decode8b before fp8 2
  gputests gpu0 ${GPU0_TESTS:-tests/kernels/test_fp8_gemv.py tests/kernels/test_pdl.py}
  [ -n "${GPU0_MORE_TESTS:-}" ] && gputests gpu0_more $GPU0_MORE_TESTS
  decode8b after fp8 3; decode8b before fp8 3  # a third round where the budget is left
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1 STEP_DIR=$OUT/gpu1
  moe after 1; moe before 1; moe after 2; moe before 2
  gputests gpu1 ${GPU1_TESTS:-tests/attention/test_triton_backend.py tests/kernels/test_moe_small.py}
  budget_step gpu_tests_engine 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider tests/engine/test_gpu_engine.py -k "graphs_and_async or triton_matches_torch"
  decode8b after bf16 1; decode8b before bf16 1  # where the budget is left
}
mkdir -p "$OUT/gpu0" "$OUT/gpu1"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpus.txt" 2>&1
(taskset -c 1-15 bash -c "$(declare -f); gpu0" > "$OUT/gpu0.log" 2>&1) &
(taskset -c 16-31 bash -c "$(declare -f); gpu1" > "$OUT/gpu1.log" 2>&1) &
wait
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
