#!/usr/bin/env bash
# Issue 60: FP8 decode (8B shape, b1/b64) of this tree against $BEFORE's in one call, then
# Qwen3-30B-A3B bf16 and FP8 decode with this tree. JSON to $OUT/<name>.json.
# Usage: OUT=dir BEFORE=.before bash scripts/gpu_fp8_ab.sh
set -u
here=$(pwd); S=$here/benchmarks/shapes
run() {  # name, tree, then the benchmark's arguments
  local name=$1 dir=$2; shift 2
  (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" python3 "$@" --output "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1)
  echo "[$name rc=$?] $(grep -E '^\{"batch' "$OUT/$name.log" | cut -c1-200 | tail -3)"
}
run fp8_before "$here/${BEFORE:?}" benchmarks/decode_throughput.py --model $S/llama-3.1-8b.json \
  --batch-sizes 1 64 --context 1024 --decode-steps 32 --quantization fp8
run fp8_after "$here" benchmarks/decode_throughput.py --model $S/llama-3.1-8b.json \
  --batch-sizes 1 64 --context 1024 --decode-steps 32 --quantization fp8
for q in bf16 fp8; do
  flag=""; [ $q = fp8 ] && flag="--quantization fp8"
  run qwen30b_$q "$here" benchmarks/decode_throughput.py --model $S/qwen3-30b-a3b.json \
    --batch-sizes 1 64 --context 1024 --decode-steps 32 $flag
done
run prefill_qwen30b_fp8 "$here" benchmarks/prefill_throughput.py --model $S/qwen3-30b-a3b.json \
  --prompt-lens 4096 --repeats 3 --quantization fp8
