#!/usr/bin/env bash
# Session 47's last call: the merged tree (.) against the tree before (.before), lanes per GPU + CPU cells.
set -u
ROOT=$(pwd); B=$ROOT/.before; S=$ROOT/benchmarks/shapes; T0=$(date +%s)
run() {  # name timeout dir cores cmd...
  local name=$1 t=$2 dir=$3 cores=$4; shift 4
  local left=$(( ${END_S:-420} - ($(date +%s) - T0) ))
  [ "$left" -lt 30 ] && { echo "$name skipped (${left}s left)" >> $OUT/steps; return; }
  [ "$t" -gt "$left" ] && t=$left
  local t0=$(date +%s)
  ( cd $dir && PYTHONPATH=$dir:/tmp/site taskset -c $cores timeout -k 5 $t "$@" ) > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s (cap ${t}s) gpu=${CUDA_VISIBLE_DEVICES:-none}" >> $OUT/steps
}
DEC="benchmarks/decode_throughput.py --context 1024 --decode-steps 32 --cuda-graphs"
lane0() {
  export CUDA_VISIBLE_DEVICES=0; local c=1-9
  run warm 60 $ROOT $c python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 9
  run fp8_after 150 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --rounds 2 \
    --graph-variants PARASHIFT_L2_PREFETCH=0 --output $OUT/fp8_after.json
  run fp8_before 110 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --output $OUT/fp8_before.json
  run fp8kv_after 80 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 64 256 --kv-cache-dtype fp8 --rounds 2 \
    --graph-variants PARASHIFT_ATTN_FP8_PAIRS=0,PARASHIFT_ATTN_FP8_F16=0 --output $OUT/fp8kv_after.json
  run tests0 100 $ROOT $c env PARASHIFT_TEST_DEVICE=cuda bash -c 'python3 -m pytest -q -p no:cacheprovider \
    tests/layers/test_l2_prefetch.py tests/attention/test_cudnn_prefill.py tests/attention/test_decode_splits.py \
    tests/attention/test_rotate_attend.py tests/engine/test_gpu_moe_prefill.py; \
    python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_backend.py tests/kernels/test_moe_prefill.py \
    -k "pairs or prompt_step or fused_decode or flags or bias or fp8_experts"'
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1; local c=10-19
  run moepf_after 75 $ROOT $c python3 benchmarks/prefill_throughput.py --model $S/qwen3-30b-a3b.json --prompt-lens 512 4096 --repeats 3 --output $OUT/moepf_after.json
  run moepf_before 75 $B $c python3 benchmarks/prefill_throughput.py --model $S/qwen3-30b-a3b.json --prompt-lens 512 4096 --repeats 3 --output $OUT/moepf_before.json
  run pf8b_after 60 $ROOT $c python3 benchmarks/prefill_throughput.py --model $S/llama-3.1-8b.json --prompt-lens 4096 16384 --repeats 3 --output $OUT/pf8b_after.json
  run pf8b_before 60 $B $c python3 benchmarks/prefill_throughput.py --model $S/llama-3.1-8b.json --prompt-lens 4096 16384 --repeats 3 --output $OUT/pf8b_before.json
  run moe_after 110 $ROOT $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --rounds 2 \
    --graph-variants PARASHIFT_L2_PREFETCH=1 --output $OUT/moe_after.json
  run moe_before 80 $B $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_before.json
}
cpulane() {
  local t0=$(date +%s)
  OUT=$OUT/cpu BEFORE=$B BUDGET_S=${CPU_S:-300} CORES="20,21 22,23 24,25 26,27" \
    CELLS="float32:1 float32:16 bfloat16:1 bfloat16:16" timeout -k 5 $(( ${CPU_S:-300} + 40 )) \
    bash scripts/cpu_intel_ab.sh > $OUT/cpu_lane.log 2>&1
  echo "cpu rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/steps
}
nvidia-smi --query-gpu=index,name,power.limit,clocks.sm --format=csv > $OUT/smi.txt 2>&1
lane0 & lane1 & cpulane & wait
nvidia-smi --query-gpu=index,power.draw,clocks.sm,clocks_event_reasons.active --format=csv >> $OUT/smi.txt 2>&1
