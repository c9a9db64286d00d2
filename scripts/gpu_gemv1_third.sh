#!/usr/bin/env bash
# Issue 60 (helper gemv1), third call on ONE H200 (BUDGET_S, 150 by default, cuts the last
# step first): GEMV configs holding a program's whole weight slice, loaded before the PDL
# wait (fp8_gemm.WHOLE_SLICE_CONFIGS):
# 1. GPU tests: their outputs the same bits as the same tiles loaded after the wait;
# 2. benchmarks/fp8_gemm_sweep.py --kernels gemv at one row in the decode chain (the
#    registered GEMV configs);
# 3. benchmarks/decode_chain.py, FP8, batch 1, 32 layers (the real kernel before each GEMV):
#    the choice without them (chain_no_whole_slice) against with them (chain), and chain's
#    choices with o's set to one (chain_o_whole_slice: o after attention, as in decode);
# 4. the engine, FP8 decode b1 (8B, context 1024, CUDA graphs, no tl.dot configs), without
#    them (--no-whole-slice-gemv) then with them.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_gemv1_third.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py -k "pipelined and 4096"
budget_step sweep_gemv 25 python3 benchmarks/fp8_gemm_sweep.py --rows 1 --chain --kernels gemv \
  --workers 14 --output "$OUT/sweep_gemv.json"
budget_step chain_fp8 40 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --variants chain_no_whole_slice chain chain_o_whole_slice \
  chain_o_whole_slice16 --output "$OUT/chain_fp8.json"
for variant in no_whole_slice whole_slice; do
  flag=$([ $variant = no_whole_slice ] && echo --no-whole-slice-gemv)
  budget_step "engine_$variant" 30 python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 --context 1024 \
    --decode-steps 32 --cuda-graphs --quantization fp8 --no-dot-configs $flag \
    --output "$OUT/engine_$variant.json"
done
cat "$OUT/steps"
grep -h '^{' "$OUT"/sweep_gemv.log "$OUT"/chain_fp8.log "$OUT"/engine_*.log | cut -c1-1500
