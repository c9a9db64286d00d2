#!/usr/bin/env bash
# Issue 60 (helper gemv1), third call on ONE H200 (BUDGET_S, 150 by default, cuts the last
# step first): GEMV configs holding a program's whole weight slice, loaded before the PDL
# wait:
# 1. GPU tests: their outputs the same bits as the same tiles loaded after the wait;
# 2. benchmarks/fp8_gemm_sweep.py at one row in the decode chain (run as --kernels gemv, the
#    registered GEMV configs with them; now --kernels b1, where they are);
# 3. benchmarks/decode_chain.py, FP8, batch 1, 32 layers (the real kernel before each GEMV):
#    chain's choices, then with o's set to one (chain_o_whole_slice: o after attention, as in
#    decode). As run at 8dd28d5 they were registered (WHOLE_SLICE_CONFIGS: since removed), the
#    chain also ran without them and the engine's decode b1 without them.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_gemv1_third.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py -k "pipelined and 4096"
budget_step sweep_gemv 50 python3 benchmarks/fp8_gemm_sweep.py --rows 1 --chain --kernels b1 \
  --workers 14 --output "$OUT/sweep_gemv.json"
budget_step chain_fp8 40 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --variants chain chain_o_whole_slice chain_o_whole_slice16 --output "$OUT/chain_fp8.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/sweep_gemv.log "$OUT"/chain_fp8.log "$OUT"/engine_*.log | cut -c1-1500
