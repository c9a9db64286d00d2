#!/usr/bin/env bash
# Session 46's last call: the merged tree (.) against the tree before (.before), lanes per GPU + CPU cells.
set -u
ROOT=$(pwd); B=$ROOT/.before; S=$ROOT/benchmarks/shapes; T0=$(date +%s)
run() {  # name timeout dir cores cmd...
  local name=$1 t=$2 dir=$3 cores=$4; shift 4
  local left=$(( ${END_S:-500} - ($(date +%s) - T0) ))
  [ "$left" -lt 30 ] && { echo "$name skipped (${left}s left)" >> $OUT/steps; return; }
  [ "$t" -gt "$left" ] && t=$left
  local t0=$(date +%s)
  ( cd $dir && PYTHONPATH=$dir:/tmp/site taskset -c $cores timeout -k 5 $t "$@" ) > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s (cap ${t}s) gpu=${CUDA_VISIBLE_DEVICES:-none}" >> $OUT/steps
}
DEC="benchmarks/decode_throughput.py --context 1024 --decode-steps 32 --cuda-graphs"
lane0() {
  export CUDA_VISIBLE_DEVICES=0; local c=1-9
  run fp8_after 240 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --rounds 3 \
    --graph-variants PARASHIFT_ATTN_SPLIT_TOKENS=128,PARASHIFT_ATTN_NEW_FIRST=0,PARASHIFT_ATTN_REDUCE_EARLY=0,PARASHIFT_GEMV_EVICT_FIRST=0 \
    --output $OUT/fp8_after.json
  run fp8_before 170 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --output $OUT/fp8_before.json
  run tests0 90 $ROOT $c env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
    tests/engine/test_gpu_dense_gemm.py tests/kernels/test_dense_gemm_tma.py tests/layers/test_l2_prefetch.py \
    "tests/kernels/test_pdl.py::test_engine_tokens_and_logprobs_are_the_same_with_pdl"
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1; local c=10-19
  run moe_after 170 $ROOT $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --rounds 3 \
    --graph-variants PARASHIFT_MOE_NORM_ROUTER=0 --output $OUT/moe_after.json
  run moe_before 110 $B $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_before.json
  run bf16_after 120 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 256 --rounds 2 \
    --graph-variants PARASHIFT_DENSE_TMA=0 --output $OUT/bf16_after.json
  run bf16_before 90 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 256 --output $OUT/bf16_before.json
  run tests1 60 $ROOT $c env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_moe_norm_router.py tests/layers/test_norm_router.py tests/kernels/test_skinny_gemm.py tests/kernels/test_gemm_timing.py
}
cpulane() {
  local t0=$(date +%s)
  OUT=$OUT/cpu BEFORE=$B BUDGET_S=${CPU_S:-330} CORES="20,21 22,23 24,25 26,27" \
    CELLS="float32:1 float32:16 bfloat16:1 bfloat16:16" timeout -k 5 $(( ${CPU_S:-330} + 40 )) \
    bash scripts/cpu_intel_ab.sh > $OUT/cpu_lane.log 2>&1
  echo "cpu rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/steps
}
nvidia-smi --query-gpu=index,name,power.limit,clocks.sm --format=csv > $OUT/smi.txt 2>&1
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
lane0 & lane1 & cpulane & wait
nvidia-smi --query-gpu=index,power.draw,clocks.sm,clocks_event_reasons.active --format=csv >> $OUT/smi.txt 2>&1
