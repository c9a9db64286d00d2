#!/usr/bin/env bash
# Session 49's x2 call: the merged tree (.) against the tree before session 48 (.before = 29007ad),
# one lane a GPU; lane 0 also measures the FP8 gate_up with SiLU·mul in its epilogue (opt-in).
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
  run fp8_after 200 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --rounds 3 \
    --graph-variants PARASHIFT_FP8_GATE_UP_SILU=1 --output $OUT/fp8_after.json
  run fp8_before 150 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 --quantization fp8 --output $OUT/fp8_before.json
  run kernel_ab 60 $ROOT $c python3 benchmarks/fp8_gated_ab.py --rows 16 32 64 --rounds 3 --output $OUT/kernel_ab.json
  run steadiness 60 $ROOT $c python3 benchmarks/choice_steadiness.py --rows 1 64 --repeats 4 --output $OUT/steadiness.json
  run gtests 200 $ROOT $c env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_fp8_gated_tma.py tests/layers/test_fp8_gated_silu.py \
    tests/kernels/test_pdl.py::test_the_gated_gate_up_gives_the_same_bits_with_pdl \
    tests/attention/test_triton_backend.py::test_fp8_pairs_one_row_preloaded tests/engine/test_gpu_moe_prefill.py
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1; local c=14-27
  run bf16_after 110 $ROOT $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 256 --rounds 2 --output $OUT/bf16_after.json
  run bf16_before 110 $B $c python3 $DEC --model $S/llama-3.1-8b.json --batch-sizes 1 64 256 --rounds 2 --output $OUT/bf16_before.json
  run moe_after 90 $ROOT $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_after.json
  run moe_before 90 $B $c python3 $DEC --model $S/qwen3-30b-a3b.json --batch-sizes 1 64 --max-model-len 8192 --output $OUT/moe_before.json
  run pf8b_after 60 $ROOT $c python3 benchmarks/prefill_throughput.py --model $S/llama-3.1-8b.json --prompt-lens 4096 16384 --repeats 3 --output $OUT/pf8b_after.json
  run pf8b_before 60 $B $c python3 benchmarks/prefill_throughput.py --model $S/llama-3.1-8b.json --prompt-lens 4096 16384 --repeats 3 --output $OUT/pf8b_before.json
}
nvidia-smi --query-gpu=index,name,power.limit,clocks.sm --format=csv > $OUT/smi.txt 2>&1
run warm 60 $ROOT 0-27 python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 26
lane0 & lane1 & wait
nvidia-smi --query-gpu=index,power.draw,clocks.sm,clocks_event_reasons.active --format=csv >> $OUT/smi.txt 2>&1
cat $OUT/steps
