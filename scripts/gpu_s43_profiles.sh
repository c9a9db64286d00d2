#!/usr/bin/env bash
# Session 43's first call (one H200): kernel breakdowns with PDL off (true kernel times, no
# waits inside kernels) for the one-GPU work, the TP-shard GEMMs for issue 59's cost model and
# FP8 against bf16 prefill at 4,096 tokens in one call (issue 60).
# Usage: OUT=dir bash scripts/gpu_s43_profiles.sh
set -u
: "${OUT:?a folder for the results}"
export PYTHONUNBUFFERED=1
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
MOE=benchmarks/shapes/qwen3-30b-a3b.json
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name $(date +%T)"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name exit $? $(date +%T)"; grep -E '^\{' "$OUT/$name.log" | cut -c1-300 | tail -4
}
step moe_b1_nopdl 150 env PARASHIFT_PDL=0 python3 benchmarks/decode_throughput.py --model $MOE \
  --batch-sizes 1 --max-model-len 8192 --decode-steps 32 --cuda-graphs --profile \
  --output $OUT/moe_b1_nopdl.json
step dense_nopdl 120 env PARASHIFT_PDL=0 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
  --batch-sizes 1 64 256 --context 1024 --decode-steps 32 --cuda-graphs --profile \
  --output $OUT/dense_nopdl.json
step fp8_nopdl 120 env PARASHIFT_PDL=0 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
  --quantization fp8 --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs --profile \
  --output $OUT/fp8_nopdl.json
step prefill_bf16 90 python3 benchmarks/prefill_throughput.py --model $EIGHT_B --prompt-lens 4096 \
  --repeats 5 --profile --output $OUT/prefill_bf16.json
step prefill_fp8 90 python3 benchmarks/prefill_throughput.py --model $EIGHT_B --prompt-lens 4096 \
  --repeats 5 --quantization fp8 --profile --output $OUT/prefill_fp8.json
step gemm_tp 90 python3 benchmarks/fp8_gemm.py --tp 2 4 --bf16-only --rows 1 4 16 32 64 256 \
  --output $OUT/gemm_tp_shards.json
