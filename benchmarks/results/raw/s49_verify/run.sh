#!/usr/bin/env bash
# Session 49, second x2 call: steady_choice at 0.5% and the fused SiLU on by default (.) against 29007ad (.before); a b64 FP8 profile
set -u
ROOT=$(pwd); B=$ROOT/.before; S=$ROOT/benchmarks/shapes; T0=$(date +%s)
run() {  # name timeout dir cores cmd...
  local name=$1 t=$2 dir=$3 cores=$4; shift 4
  local left=$(( ${END_S:-540} - ($(date +%s) - T0) ))
  [ "$left" -lt 30 ] && { echo "$name skipped (${left}s left)" >> $OUT/steps; return; }
  [ "$t" -gt "$left" ] && t=$left
  local t0=$(date +%s)
  ( cd $dir && PYTHONPATH=$dir:/tmp/site taskset -c $cores timeout -k 5 $t "$@" ) > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s (cap ${t}s) gpu=${CUDA_VISIBLE_DEVICES:-none}" >> $OUT/steps
}
DEC="benchmarks/decode_throughput.py --context 1024 --decode-steps 32 --cuda-graphs"
lane0() {
  export CUDA_VISIBLE_DEVICES=0; local c=0-13
  run fp8_after 200 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --rounds 2 \
    --graph-variants PARASHIFT_FP8_GATE_UP_SILU=0 --output $OUT/fp8_after.json
  run fp8_before 150 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --output $OUT/fp8_before.json
  run ceiling64 120 $ROOT $c python3 benchmarks/step_ceiling.py --model $S/llama-3.1-8b.json --quantization fp8 --batch-sizes 64 \
    --rounds 2 --graph-variants PARASHIFT_PDL=0 --profile-variants PARASHIFT_PDL=0 --output $OUT/ceiling64.json
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1; local c=14-27
  run bf16_after 110 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --rounds 2 --output $OUT/bf16_after.json
  run bf16_before 110 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --rounds 2 --output $OUT/bf16_before.json
  run moe_after 90 $ROOT $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_after.json
  run moe_before 90 $B $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_before.json
}
nvidia-smi --query-gpu=index,name,power.limit,clocks.sm --format=csv > $OUT/smi.txt 2>&1
run warm 60 $ROOT 0-27 python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 26
lane0 & lane1 & wait
cat $OUT/steps
