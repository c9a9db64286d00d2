#!/usr/bin/env bash
# Issue 60 (helper gemv1), second call on ONE H200 (BUDGET_S, 240 by default, cuts the last
# step first):
# 1. the GPU tests of the TMA GEMV (registered configs, bf16) and an FP8 engine's greedy
#    tokens with it at 1-4 rows equal to those with fp8_gemv.py's GEMV;
# 2. benchmarks/decode_chain.py, FP8, batch 1, 32 layers: the choice without the TMA GEMV
#    (PARASHIFT_FP8_TMA=0) against with it (the registered configs);
# 3. the engine, FP8 decode b1 (8B shape, context 1024, CUDA graphs), PARASHIFT_FP8_TMA=0
#    then 1, without the tl.dot configs (never chosen at 1-4 rows; the start-up compiles
#    warmed first into Triton's cache by the sweep's workers).
# Usage (repository root): OUT=dir [BUDGET_S=240] bash scripts/gpu_gemv1_second.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-240}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv_tma.py
budget_step chain_fp8 50 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --variants chain_no_tma chain --output "$OUT/chain_fp8.json"
budget_step warm 20 python3 benchmarks/fp8_gemm_sweep.py --warm-only --warm-rows 1 2 4 \
  --no-dot-configs --workers 14
for tma in 0 1; do
  budget_step "engine_tma$tma" 45 env PARASHIFT_FP8_TMA=$tma python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 --decode-steps 32 \
    --cuda-graphs --quantization fp8 --no-dot-configs --output "$OUT/engine_tma$tma.json"
done
cat "$OUT/steps"
grep -h '^{' "$OUT"/chain_fp8.log "$OUT"/engine_tma*.log | cut -c1-1500
