#!/usr/bin/env bash
# Issue 61 deliverable 1 (helper prefill), second call on ONE H200, in priority order
# (BUDGET_S, 235 by default, skips the last first):
# 1. chunked prefill of one 32,768- and one 16,384-token prompt at 8,192 tokens a step (the
#    chunks after the cached prefix through the cuDNN chunk route), this tree's route (merge
#    kernel, GQA in the call) against session 43's (PARASHIFT_CUDNN_CHUNK_FUSED=0), in turn,
#    two rounds (the command of docs/results.md's chunked rows);
# 2. GPU tests of the merge kernel and the cuDNN routes.
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_prefill_second.sh
set -u
: "${OUT:?a folder for the results}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
chunked() {  # chunked NAME FUSED
  budget_step "$1" 45 env PARASHIFT_CUDNN_CHUNK_FUSED=$2 python3 benchmarks/prefill_throughput.py \
    --model $EIGHT_B --prompt-lens 32768 16384 --step-tokens 8192 --repeats 3 --output "$OUT/$1.json"
}
chunked chunked_fused_1 1
chunked chunked_s43_1 0
chunked chunked_fused_2 1
chunked chunked_s43_2 0
budget_step gpu_tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_lse_merge.py tests/attention/test_cudnn_prefill.py
cat "$OUT/steps"
grep -h '^{' "$OUT"/chunked_*.log | cut -c1-300
