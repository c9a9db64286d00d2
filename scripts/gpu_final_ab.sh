#!/usr/bin/env bash
# A session's last call: this tree (the session's merges) against $BEFORE (main's tree before
# them), each engine in a fresh process, the two trees in turn. A lane a GPU, each on cores of
# its own: lane i runs $GPU<i> (i = 0..7, those set), a list of the steps below, e.g.
#   GPU0='warm after; warm before; rounds 2 decode8b fp8; gputests gpu0 tests/kernels/test_pdl.py'
#   GPU1='rounds 2 moe; enginetests; decode8b after bf16 1; decode8b before bf16 1'
# With no $GPU<i> set: $DEFAULT_GPU0 and $DEFAULT_GPU1 below (session 45's last call: FP8 8B
# and MoE decode A/B, the tests of $GPU0_TESTS, $GPU0_MORE_TESTS and $GPU1_TESTS, then bf16).
# Then, on all GPUs, $BOTH where set (a command run in the repository root with
# OUT=$OUT/both, 200 s at most).
# Steps (TREE: after or before; results and logs in $OUT/gpu<i>/, a line each in its `steps`):
#   warm TREE                 the FP8 GEMM candidates an engine's start-up compiles, 12 processes
#   decode8b TREE WEIGHTS R   8B decode b1/b64, context 1024, CUDA graphs (WEIGHTS fp8 or bf16)
#   moe TREE [R]              Qwen3-30B-A3B decode b1/b64, CUDA graphs
#   chunked TREE              8B bf16 prefill of 32,768 and 16,384 tokens at 8,192 a step
#   prefill TREE WEIGHTS [SUFFIX ENV=VALUE]   8B prefill of 512 and 4,096 tokens
#   rounds N STEP ARGS...     STEP after ARGS r, then STEP before ARGS r, for r = 1..N
#   gputests NAME TESTS...    GPU tests, this tree (PARASHIFT_TEST_DEVICE=cuda)
#   enginetests               the engine's graph tests on the GPU, this tree
# Each step is skipped where its usual seconds (NEED_FP8, NEED_BF16, NEED_MOE, ... below) would
# pass $BUDGET_S (scripts/budget_step.sh). Usage (repository root, $BEFORE unpacked there):
#   OUT=dir BEFORE=.before [BUDGET_S=540] [GPU0=...] [GPU1=...] [GPU0_TESTS=...]
#   [GPU1_TESTS=...] [BOTH="command"] bash scripts/gpu_final_ab.sh
set -u
: "${OUT:?a folder for the results}"
here=$(pwd)
before=$here/${BEFORE:?the tree before, unpacked in the repository root}
budget=${BUDGET_S:-540}
S=$here/benchmarks/shapes
NEED_WARM=${NEED_WARM:-40} NEED_FP8=${NEED_FP8:-70} NEED_BF16=${NEED_BF16:-55}
NEED_MOE=${NEED_MOE:-70} NEED_CHUNKED=${NEED_CHUNKED:-70} NEED_PREFILL=${NEED_PREFILL:-45}
NEED_TESTS=${NEED_TESTS:-75} NEED_ENGINE_TESTS=${NEED_ENGINE_TESTS:-60}
DEFAULT_GPU0='warm after; warm before; rounds 2 decode8b fp8
  gputests gpu0 ${GPU0_TESTS:-tests/kernels/test_fp8_gemv.py tests/kernels/test_pdl.py}
  [ -n "${GPU0_MORE_TESTS:-}" ] && gputests gpu0_more $GPU0_MORE_TESTS
  decode8b after fp8 3; decode8b before fp8 3'
DEFAULT_GPU1='rounds 2 moe
  gputests gpu1 ${GPU1_TESTS:-tests/attention/test_triton_backend.py tests/kernels/test_moe_small.py}
  enginetests; decode8b after bf16 1; decode8b before bf16 1'
source scripts/budget_step.sh
IN_TREE='cd "$1" && shift && PYTHONPATH="$(pwd):${SITE:-/tmp/site}" exec "$@"'  # bash -c "$IN_TREE" _ DIR COMMAND...
export here before budget S OUT IN_TREE NEED_WARM NEED_FP8 NEED_BF16 NEED_MOE NEED_CHUNKED \
  NEED_PREFILL NEED_TESTS NEED_ENGINE_TESTS
tree() { [ "$1" = before ] && echo "$before" || echo "$here"; }
in_tree() {  # in_tree NAME NEED TREE COMMAND...: budget_step of COMMAND run in TREE
  local name=$1 need=$2 dir; dir=$(tree "$3"); shift 3
  budget_step "$name" "$need" bash -c "$IN_TREE" _ "$dir" "$@"
}
warm() {  # warm TREE
  in_tree "warm_$1" "$NEED_WARM" "$1" python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 12
}
decode8b() {  # decode8b TREE WEIGHTS ROUND
  local quant=() need=$NEED_BF16; [ "$2" = fp8 ] && quant=(--quantization fp8) need=$NEED_FP8
  in_tree "dense_${2}_${1}_$3" "$need" "$1" python3 benchmarks/decode_throughput.py \
    --model "$S/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 --decode-steps 32 \
    --cuda-graphs ${quant[@]+"${quant[@]}"} --output "$STEP_DIR/dense_${2}_${1}_$3.json"
}
moe() {  # moe TREE [ROUND]
  in_tree "moe_$1${2:+_$2}" "$NEED_MOE" "$1" python3 benchmarks/decode_throughput.py \
    --model "$S/qwen3-30b-a3b.json" --batch-sizes 1 64 --max-model-len 8192 --decode-steps 32 \
    --cuda-graphs --output "$STEP_DIR/moe_$1${2:+_$2}.json"
}
chunked() {  # chunked TREE: long prompts, chunks after a cached prefix
  in_tree "chunked_$1" "$NEED_CHUNKED" "$1" python3 benchmarks/prefill_throughput.py \
    --model "$S/llama-3.1-8b.json" --prompt-lens 32768 16384 --step-tokens 8192 --repeats 3 \
    --output "$STEP_DIR/chunked_$1.json"
}
prefill() {  # prefill TREE WEIGHTS [NAME_SUFFIX ENV=VALUE]
  local quant=(); [ "$2" = fp8 ] && quant=(--quantization fp8)
  in_tree "prefill_${2}_$1${3:-}" "$NEED_PREFILL" "$1" env ${4:-PARASHIFT_NONE=0} \
    python3 benchmarks/prefill_throughput.py --model "$S/llama-3.1-8b.json" \
    --prompt-lens 512 4096 --repeats 5 ${quant[@]+"${quant[@]}"} \
    --output "$STEP_DIR/prefill_${2}_$1${3:-}.json"
}
rounds() {  # rounds N STEP ARGS...
  local n=$1 step=$2 r; shift 2
  for r in $(seq "$n"); do "$step" after "$@" "$r"; "$step" before "$@" "$r"; done
}
gputests() {  # gputests NAME TESTS...
  local name=$1; shift
  budget_step "gpu_tests_$name" "$NEED_TESTS" env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest \
    -q -p no:cacheprovider "$@"
}
enginetests() {
  budget_step gpu_tests_engine "$NEED_ENGINE_TESTS" env PARASHIFT_TEST_DEVICE=cuda python3 -m \
    pytest -q -p no:cacheprovider tests/engine/test_gpu_engine.py \
    -k "graphs_and_async or triton_matches_torch"
}
lane() {  # lane GPU STEPS
  export CUDA_VISIBLE_DEVICES=$1 STEP_DIR=$OUT/gpu$1
  eval "$2"
}
gpus=()
for i in 0 1 2 3 4 5 6 7; do name=GPU$i; [ -n "${!name:-}" ] && gpus+=("$i"); done
if [ ${#gpus[@]} -eq 0 ]; then GPU0=$DEFAULT_GPU0 GPU1=$DEFAULT_GPU1 gpus=(0 1); fi
share=$(( $(nproc) / ${#gpus[@]} )) n=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpus.txt" 2>&1
for i in "${gpus[@]}"; do  # lane n on cores n*share..(n+1)*share-1, core 0 left to this script
  mkdir -p "$OUT/gpu$i"
  first=$(( n * share )); [ $first -eq 0 ] && first=1
  name=GPU$i
  (taskset -c "$first-$(( (n + 1) * share - 1 ))" bash -c "$(declare -f); lane $i \"\$1\"" _ \
    "${!name}" > "$OUT/gpu$i.log" 2>&1) &
  n=$((n + 1))
done
wait
for i in "${gpus[@]}"; do cat "$OUT/gpu$i.log"; done
if [ -n "${BOTH:-}" ]; then
  mkdir -p "$OUT/both"; echo "== both $(date +%T)"
  (cd "$here" && OUT="$OUT/both" timeout 200 bash -c "$BOTH") > "$OUT/both.log" 2>&1
  echo "== both exit $? $(date +%T)"; tail -20 "$OUT/both.log" | cut -c1-300
fi
