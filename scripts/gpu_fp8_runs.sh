#!/usr/bin/env bash
# Issue 60: FP8 end to end on one H200, bf16 beside it in the same call. JSON to $OUT/<name>.json,
# a few lines of each run's log to stdout. PART picks the runs: dense (8B decode b1/b64, prefill
# 4096), kv (FP8 KV: b8 at 32k, b1 at ~128k), big (Qwen3-30B-A3B bf16/FP8 decode, 70B FP8 decode).
# Usage: OUT=dir PART=dense|kv|big bash scripts/gpu_fp8_runs.sh
set -u
S=benchmarks/shapes
run() {  # name, then the benchmark's command line
  local name=$1; shift
  python3 "$@" --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "[$name rc=$?] $(grep -E '^\{"batch|^\{"prompt|fraction|Error|error' "$OUT/$name.log" | tail -4 | cut -c1-260)"
}
case ${PART:?dense, kv or big} in
dense)
  for q in bf16 fp8; do
    flag=""; [ $q = fp8 ] && flag="--quantization fp8"
    run decode_8b_$q benchmarks/decode_throughput.py --model $S/llama-3.1-8b.json --batch-sizes 1 64 \
      --context 1024 --decode-steps 32 $flag
    run prefill_8b_$q benchmarks/prefill_throughput.py --model $S/llama-3.1-8b.json --prompt-lens 4096 \
      --repeats 5 $flag
  done ;;
kv)
  for kv in auto fp8; do
    run kv32k_8b_$kv benchmarks/decode_throughput.py --model $S/llama-3.1-8b.json --batch-sizes 8 \
      --context 32768 --max-model-len 34816 --decode-steps 16 --kv-cache-dtype $kv
    run kv128k_8b_$kv benchmarks/decode_throughput.py --model $S/llama-3.1-8b.json --batch-sizes 1 \
      --context 126976 --max-model-len 131072 --decode-steps 16 --kv-cache-dtype $kv
  done ;;
big)
  for q in bf16 fp8; do
    flag=""; [ $q = fp8 ] && flag="--quantization fp8"
    run decode_qwen30b_$q benchmarks/decode_throughput.py --model $S/qwen3-30b-a3b.json \
      --batch-sizes 1 64 --context 1024 --decode-steps 32 $flag
  done
  run decode_70b_fp8 benchmarks/decode_throughput.py --model $S/llama-3.1-70b.json \
    --batch-sizes 1 16 64 --context 1024 --decode-steps 16 --quantization fp8 ;;
esac
